"""Counters: named numbers a process counts (requests, bytes, skips, cache hits), added
across stages, workers and iterations. The one home of counting for io, the cache, the
stages and the loader's statistics."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from shardkit.per_process import fork_generation

__all__ = ["Counters", "add_counts", "counter_delta"]


def add_counts(into: dict[str, float], more: Mapping[str, float]) -> None:
    """Add ``more``'s counters into ``into``."""
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def counter_delta(now: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float]:
    """The counters since ``base`` was taken."""
    return {k: float(v) - float(base.get(k, 0.0)) for k, v in now.items()}


class Counters:
    """Thread-safe named counters of one process (requests, bytes, retries, cache hits).

    They count this process only: a forked or unpickled copy starts from zero, so the
    counters of a loader's workers can be summed without counting the parent's twice.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a close() run by the GC may count while held
        self._values: dict[str, float] = {}
        self._made_in = fork_generation()

    def __getstate__(self) -> dict[str, object]:
        return {}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    def _mine(self) -> dict[str, float]:
        if self._made_in != fork_generation():
            self._lock = threading.RLock()
            self._values = {}
            self._made_in = fork_generation()
        return self._values

    def add(self, name: str, n: float = 1) -> None:
        values = self._mine()
        with self._lock:
            values[name] = values.get(name, 0) + n

    def snapshot(self) -> dict[str, float]:
        values = self._mine()
        with self._lock:
            return dict(values)
