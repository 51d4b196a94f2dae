"""Loader statistics: throughput, how long the training loop waited, what was skipped.

The consumer side records the wait for each batch; workers send their counters (samples,
bytes, skips, io) with their batches, relative to the start of the iteration, so the
totals are the sum of each worker's latest counters plus those of finished iterations.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["LoaderStats", "counter_delta"]

_COUNTERS = ("samples", "bytes", "skipped_shards", "skipped_samples")


def counter_delta(now: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float]:
    """Counters since ``base`` was taken."""
    return {k: float(v) - float(base.get(k, 0.0)) for k, v in now.items()}


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + float(v)


class LoaderStats:
    """Accumulates what a :class:`~shardkit.WebLoader` saw.

    Args:
        window: how many of the latest batch waits the p99 is taken over.
    """

    def __init__(self, window: int = 10_000) -> None:
        self.waits: deque[float] = deque(maxlen=window)
        self.wait_total = 0.0
        self.batches = 0
        self._wall_done = 0.0
        self._t0: float | None = None
        self._t_last: float | None = None
        self._done: dict[str, float] = {}
        self._io_done: dict[str, float] = {}
        self._current: dict[int, Mapping[str, float]] = {}
        self._io_current: dict[int, Mapping[str, float]] = {}

    def start(self) -> None:
        """A new iteration begins: fold the last one's worker counters into the totals."""
        self.stop()
        for c in self._current.values():
            _add(self._done, c)
        for c in self._io_current.values():
            _add(self._io_done, c)
        self._current, self._io_current = {}, {}
        self._t0 = self._t_last = time.perf_counter()

    def stop(self) -> None:
        """The iteration ended (or was abandoned)."""
        if self._t0 is not None and self._t_last is not None:
            self._wall_done += self._t_last - self._t0
        self._t0 = self._t_last = None

    def record(
        self,
        wait: float,
        worker: int | None = None,
        counters: Mapping[str, float] | None = None,
        io: Mapping[str, float] | None = None,
    ) -> None:
        """One batch arrived after ``wait`` seconds; a worker's counters came with it."""
        self.waits.append(wait)
        self.wait_total += wait
        self.batches += 1
        self._t_last = time.perf_counter()
        if worker is not None and counters is not None:
            self._current[worker] = counters
        if worker is not None and io is not None:
            self._io_current[worker] = io

    def totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(counters, io counters)`` summed over iterations and workers."""
        counts = dict.fromkeys(_COUNTERS, 0.0)
        _add(counts, self._done)
        io = dict(self._io_done)
        for c in self._current.values():
            _add(counts, c)
        for c in self._io_current.values():
            _add(io, c)
        return counts, io

    def summary(self) -> dict[str, Any]:
        """samples/s, MB/s, mean and p99 wait, wait fraction, skips and io counters."""
        wall = self._wall_done
        if self._t0 is not None and self._t_last is not None:
            wall += self._t_last - self._t0
        counts, io = self.totals()
        waits = np.fromiter(self.waits, dtype=np.float64)
        per_s = (lambda x: x / wall) if wall > 0 else (lambda x: 0.0)
        return {
            "batches": self.batches,
            "samples": int(counts["samples"]),
            "bytes": int(counts["bytes"]),
            "seconds": wall,
            "samples_per_s": per_s(counts["samples"]),
            "mb_per_s": per_s(counts["bytes"]) / 1e6,
            "wait_mean_s": float(waits.mean()) if len(waits) else 0.0,
            "wait_p99_s": float(np.percentile(waits, 99)) if len(waits) else 0.0,
            "wait_fraction": self.wait_total / wall if wall > 0 else 0.0,
            "skipped_shards": int(counts["skipped_shards"]),
            "skipped_samples": int(counts["skipped_samples"]),
            "io": io,
        }
