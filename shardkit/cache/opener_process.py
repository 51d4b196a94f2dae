"""What one process of a caching opener owns: its fills (shared by its readers), the shards
it prefetched and holds leases on, and its prefetch threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from shardkit.cache.fill import ShardFill

__all__ = ["OpenerProcess"]


class OpenerProcess:
    """What one process of a caching opener owns: its downloads and prefetch threads.

    Prefetch threads are daemons, so a process never waits for them at exit; a download
    cut short that way leaves a temp file the next reservation removes.
    """

    def __init__(self, threads: int) -> None:
        # reentrant: the GC may close an abandoned stream (and give back its lease) in the
        # thread that holds it
        self.lock = threading.RLock()
        self.fills: dict[str, ShardFill] = {}
        self.queued: set[str] = set()
        self.leases: dict[str, int] = {}  # prefetched shards, kept from eviction until read
        self.warned = False
        self._threads = threads
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._started = 0
        self._pending = 0  # jobs submitted and not ended
        self._idle = threading.Condition(self.lock)

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in a prefetch thread."""
        with self.lock:
            self._pending += 1
            if self._started < self._threads:
                self._started += 1
                name = f"shardkit-prefetch-{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                self._jobs.get()()
            finally:
                with self.lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until every job submitted has ended; False if ``timeout`` came first."""
        with self.lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)
