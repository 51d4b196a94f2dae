"""Loader statistics: throughput, how long the training loop waited, cache, retries, skips.

The consumer side records the wait for each batch; workers send their counters (samples,
bytes, skips, errors, io) with their batches, relative to the start of the iteration.
:meth:`LoaderStats.summary` gives the fixed schema of :mod:`shardkit.metrics.schema`
for the whole run and for the latest iteration (``this_epoch``); :func:`job_summary`
sums it (or takes the min / max) across the ranks of a process group.

``WebLoader.stats()`` returns that summary::

    stats = loader.stats()
    stats["samples_per_s"], stats["wait_fraction"], stats["this_epoch"]["wait_p99_s"]
    job = sk.metrics.job_summary(stats)        # every rank calls it (a collective)
    sk.metrics.watch_idle(loader, threshold=0.10, steps=100, callback=page_me)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardkit.counters import counter_delta
from shardkit.errors import ConfigError
from shardkit.metrics.alert import IdleAlert
from shardkit.metrics.job import job_summary
from shardkit.metrics.schema import SCHEMA_VERSION, WINDOW_KEYS, window

__all__ = [
    "IdleAlert",
    "LoaderStats",
    "WINDOW_KEYS",
    "counter_delta",
    "job_summary",
    "tracker",
    "watch_idle",
]

_TIMELINE = (
    "t",
    "wait",
    "worker",
    "iteration",
    "samples",
    "bytes_fetched",
    "cache_opens",
    "cache_fills",
)


def _add_delta(
    into: list[dict[str, float]], new: Mapping[str, float], old: Mapping[str, float]
) -> None:
    for k, v in new.items():
        d = float(v) - float(old.get(k, 0.0))
        if d:
            for target in into:
                target[k] = target.get(k, 0.0) + d


class _Sums:
    """Running sums of one window (an iteration, or all of them)."""

    def __init__(self, window: int) -> None:
        self.batches = 0
        self.seconds = 0.0
        self.wait_total = 0.0
        self.first_batch_s: float | None = None
        self.waits: deque[float] = deque(maxlen=window)
        self.counts: dict[str, float] = {}
        self.io: dict[str, float] = {}
        self.extra: dict[str, float] = {}
        self.workers: dict[int, tuple[int, dict[str, float]]] = {}

    def worker(self, w: int) -> dict[str, float]:
        n, c = self.workers.get(w, (0, {}))
        self.workers[w] = (n + 1, c)
        return c

    def summary(self, seconds: float) -> dict[str, Any]:
        out = window(
            batches=self.batches,
            seconds=seconds,
            first_batch_s=self.first_batch_s or 0.0,
            waits=self.waits,
            wait_total=self.wait_total,
            counts=self.counts,
            io=self.io,
            workers=self.workers,
        )
        for k, v in self.extra.items():
            out[k] = round(v) if float(v).is_integer() else v
        return out


class LoaderStats:
    """Accumulates what a :class:`~shardkit.WebLoader` saw (see :mod:`shardkit.metrics`).

    Args:
        window: how many of the latest batch waits the percentiles are taken over.
        timeline: how many of the latest batches :meth:`timeline` keeps (for plots).
    """

    def __init__(self, window: int = 10_000, timeline: int = 100_000) -> None:
        self._window = window
        self.total = _Sums(window)
        self.current = _Sums(window)
        self.alerts: list[IdleAlert] = []
        self.epoch: int | None = None
        self.iterations = 0
        self._t0: float | None = None
        self._t_last: float | None = None
        self._t_prev = 0.0
        self._created = time.perf_counter()
        self._prev: dict[int, Mapping[str, float]] = {}
        self._prev_io: dict[int, Mapping[str, float]] = {}
        self._prev_extra: dict[str, float] = {}
        self._timeline: deque[tuple[float, ...]] = deque(maxlen=timeline)
        self._lock = threading.Lock()  # an exporter's thread may read while batches come

    @property
    def batches(self) -> int:
        """Batches received over every iteration."""
        return self.total.batches

    def start(self, epoch: int | None = None) -> None:
        """A new iteration (of ``epoch``) begins: ``this_epoch`` starts from zero."""
        with self._lock:
            self._start(epoch)

    def _start(self, epoch: int | None) -> None:
        self._stop()
        self.current = _Sums(self._window)
        self._prev, self._prev_io, self._prev_extra = {}, {}, {}
        self.epoch = epoch
        self.iterations += 1
        self._t0 = self._t_last = time.perf_counter()
        for alert in self.alerts:
            alert.restart()

    def stop(self) -> None:
        """The iteration ended (or was abandoned)."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._t0 is not None and self._t_last is not None:
            span = self._t_last - self._t0
            self.total.seconds += span
            self.current.seconds += span
        self._t0 = self._t_last = None

    def record(
        self,
        wait: float,
        worker: int | None = None,
        counters: Mapping[str, float] | None = None,
        io: Mapping[str, float] | None = None,
        *,
        io_worker: int | None = None,
        **extra: float,
    ) -> None:
        """One batch arrived after ``wait`` seconds; ``worker``'s counters (since the
        iteration began) came with it, and the io counters of ``io_worker`` (default: the
        worker; thread workers share their process's). ``extra`` keyword counters (this iteration's
        running totals, e.g. skips summed across ranks) appear as keys of both windows.
        """
        now = time.perf_counter()
        with self._lock:
            self._record(now, wait, worker, counters, io, extra, io_worker)
        if self.current.batches > 1:
            span = now - self._t_prev
            for alert in self.alerts:
                alert.observe(wait, span)

    def _record(
        self,
        now: float,
        wait: float,
        worker: int | None,
        counters: Mapping[str, float] | None,
        io: Mapping[str, float] | None,
        extra: Mapping[str, float],
        io_worker: int | None = None,
    ) -> None:
        if self._t0 is None:  # recorded outside an iteration: start one
            self._start(self.epoch)
        assert self._t0 is not None and self._t_last is not None
        self._t_prev = self._t_last
        first = self.current.batches == 0
        cur, tot = self.current, self.total
        for s in (cur, tot):
            s.waits.append(wait)
            s.wait_total += wait
            s.batches += 1
        if first:
            cur.first_batch_s = now - self._t0
            if tot.first_batch_s is None:
                tot.first_batch_s = cur.first_batch_s
        w = -1 if worker is None else worker
        if counters is not None:
            targets = [cur.counts, tot.counts, cur.worker(w), tot.worker(w)]
            _add_delta(targets, counters, self._prev.get(w, {}))
            self._prev[w] = counters
        else:
            cur.worker(w)
            tot.worker(w)
        if io is not None:
            k = w if io_worker is None else io_worker
            _add_delta([cur.io, tot.io], io, self._prev_io.get(k, {}))
            self._prev_io[k] = io
        if extra:
            _add_delta([cur.extra, tot.extra], extra, self._prev_extra)
            self._prev_extra = {**self._prev_extra, **extra}
        self._t_last = now
        self._timeline.append(
            (
                now - self._created,
                wait,
                w,
                self.iterations,
                tot.counts.get("samples", 0.0),
                tot.io.get("bytes_fetched", 0.0),
                tot.io.get("cache_hits", 0.0) + tot.io.get("cache_misses", 0.0),
                tot.io.get("cache_fills", 0.0),
            )
        )

    def add(self, counts: Mapping[str, float]) -> None:
        """Counts no batch carried (the samples dropped at a shared epoch end), added to
        this iteration's and the total."""
        with self._lock:
            for key, n in counts.items():
                for s in (self.current, self.total):
                    s.counts[key] = s.counts.get(key, 0.0) + n

    def totals(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(counters, io counters)`` of every iteration so far, summed over workers."""
        with self._lock:
            counts = {"samples": 0.0, "bytes": 0.0, "skipped_shards": 0.0, "skipped_samples": 0.0}
            counts.update(self.total.counts)
            return counts, dict(self.total.io)

    def _running(self) -> float:
        if self._t0 is not None and self._t_last is not None:
            return self._t_last - self._t0
        return 0.0

    def summary(self) -> dict[str, Any]:
        """The schema (:mod:`shardkit.metrics.schema`) for every iteration so far, plus
        ``schema`` (its version), ``epoch`` (the latest iteration's), ``iterations`` and
        ``this_epoch`` (the same keys for the latest iteration)."""
        with self._lock:
            return self._summary()

    def _summary(self) -> dict[str, Any]:
        run = self._running()
        out: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "epoch": self.epoch,
            "iterations": self.iterations,
        }
        out.update(self.total.summary(self.total.seconds + run))
        out["this_epoch"] = self.current.summary(self.current.seconds + run)
        return out

    def timeline(self) -> dict[str, np.ndarray]:
        """Per batch (the latest ones): ``t`` (s since the loader was made), ``wait``,
        ``worker``, ``iteration``, and the running totals ``samples``, ``bytes_fetched``,
        ``cache_opens`` (shards and indexes opened through the cache) and
        ``cache_fills`` (of them, downloaded) when it arrived."""
        with self._lock:
            rows = list(self._timeline)
        arr = np.array(rows, dtype=np.float64).reshape(-1, len(_TIMELINE))
        return {k: arr[:, i] for i, k in enumerate(_TIMELINE)}


def watch_idle(
    loader: Any,
    threshold: float = 0.10,
    steps: int = 100,
    callback: Callable[[dict[str, Any]], None] | None = None,
) -> IdleAlert:
    """Attach an :class:`IdleAlert` to a :class:`~shardkit.WebLoader` (or its
    :class:`LoaderStats`): a logged warning, and ``callback(info)``, when the training
    loop's idle share over ``steps`` batches passes ``threshold``. Returns the alert."""
    alert = IdleAlert(threshold, steps, callback)
    tracker(loader).alerts.append(alert)
    return alert


def tracker(loader: Any) -> LoaderStats:
    """The :class:`LoaderStats` a :class:`~shardkit.WebLoader` records into (itself if
    given one): for :func:`watch_idle` and :meth:`LoaderStats.timeline`."""
    stats = loader if isinstance(loader, LoaderStats) else getattr(loader, "_stats", None)
    if not isinstance(stats, LoaderStats):
        raise ConfigError(f"expected a WebLoader, not {type(loader).__name__}")
    return stats
