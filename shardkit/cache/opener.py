"""The caching opener: remote shards through the node-local cache.

``open(url, size=, checksum=)`` of a remote shard is served from the cache when the shard
is there (a hit, under a lease). On a miss, the first process on the node to ask takes the
shard's download lock and fetches it in a background thread into a temp file; it and every
other reader, in any process, read along while it arrives. ``prefetch`` does the same for
the next shards of a plan in a small thread pool, ``prefetch_depth`` ahead. Reads without
a size and checksum (a sample index, a manifest) and local files bypass the cache.

The opener is cheap to build and picklable: its threads, locks and download registry
are made per process, on first use (again after a fork).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from shardkit.cache.fill import Fill, run_fill
from shardkit.cache.locks import NodeSlots, unlock
from shardkit.cache.manifests import fetch_manifest_once
from shardkit.cache.store import CacheKey, CacheStore
from shardkit.cache.stream import CacheStream
from shardkit.errors import CacheError, ChecksumError, ConfigError
from shardkit.io.config import IoConfig
from shardkit.io.remote import RangeSource, RemoteOpener, buffered
from shardkit.urls import REMOTE_SCHEMES, url_scheme

__all__ = ["CachingOpener"]

log = logging.getLogger(__name__)


class _Local:
    """What one process of a caching opener owns: its downloads and prefetch threads.

    Prefetch threads are daemons, so a process never waits for them at exit; a download
    cut short that way leaves a temp file the next reservation removes.
    """

    def __init__(self, threads: int) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.fills: dict[str, Fill] = {}
        self.queued: set[str] = set()
        self.leases: dict[str, int] = {}  # prefetched shards, kept from eviction until read
        self.warned = False
        self._threads = threads
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._started = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in a prefetch thread."""
        self._jobs.put(job)
        with self.lock:
            if self._started < self._threads:
                self._started += 1
                name = f"shardkit-prefetch-{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            self._jobs.get()()


class CachingOpener:
    """Reads remote shards through the node-local cache (see the module docstring).

    Args:
        cfg: the io options; ``cfg.cache_dir`` must be set.
        remote: the uncached opener underneath (made from ``cfg`` if not given).
    """

    def __init__(self, cfg: IoConfig, remote: RemoteOpener | None = None) -> None:
        if cfg.cache_dir is None:
            raise CacheError("a caching opener needs a cache_dir")
        self.cfg = cfg
        self.remote = remote or RemoteOpener(cfg)
        self.counters = self.remote.counters
        self.store = CacheStore(cfg.cache_dir, cfg.cache_limit)
        root = self.store.root
        self.slots = NodeSlots(os.path.join(root, "slots"), cfg.node_requests)
        self._local_state: _Local | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_local_state"] = None
        return state

    @property
    def _local(self) -> _Local:
        if self._local_state is None or self._local_state.pid != os.getpid():
            self._local_state = _Local(self.cfg.prefetch_threads)
        return self._local_state

    # -- the Opener protocol -------------------------------------------------------
    def open(
        self,
        url: str,
        *,
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        checksum: str | None = None,
    ) -> BinaryIO:
        """Stream ``[start, end)`` of ``url``, through the cache when it can be cached."""
        if size is None or checksum is None or self.remote.source(url) is None:
            return self.remote.open(url, start=start, end=end, size=size, checksum=checksum)
        key = CacheKey.of(checksum, size)
        stop = size if end is None else min(end, size)
        if not self._usable():
            return self.remote.open(url, start=start, end=stop)
        fd = self.store.open_published(key)
        if fd is not None:
            if os.fstat(fd).st_size != size:
                os.close(fd)
                raise ChecksumError(
                    "the cached shard with this checksum has another size",
                    url=url,
                    expected=f"{size} bytes",
                )
            self.counters.add("cache_hits")
            self._drop_lease(key)  # the reader holds its own from here
            return buffered(CacheStream(self, key, url, start, stop, fd=fd))
        self.counters.add("cache_misses")
        self._drop_lease(key)
        fill = self._start_fill(key, url)
        if fill is None:
            self.counters.add("read_along")
        return buffered(CacheStream(self, key, url, start, stop, fill=fill))

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        with self.open(url, start=start, end=end) as f:
            return f.read()

    def prefetch(self, shards: list[tuple[str, int | None, str | None]]) -> None:
        """Fetch the first ``prefetch_depth`` of these next shards in the background."""
        if not self._usable():
            return
        local = self._local
        for url, size, checksum in shards[: self.cfg.prefetch_depth]:
            if size is None or checksum is None or url_scheme(url) not in REMOTE_SCHEMES:
                continue
            try:
                key = CacheKey.of(checksum, size)
            except ConfigError:
                continue  # a hint only: its open() reports the bad checksum
            with local.lock:
                running = local.fills.get(key.name)
                busy = key.name in local.queued or key.name in local.leases
                if busy or (running is not None and not running.done):
                    continue
                local.queued.add(key.name)
            local.submit(functools.partial(self._prefetch_one, key, url))

    def ensure_cached(self, url: str, size: int, checksum: str) -> str:
        """Put one shard in the cache now (``shardkit cache warm``); what happened:
        ``"cached"`` (it was there), ``"fetched"``, ``"shared"`` (another process fetched
        it and this one read along) or ``"no room"`` (the limit is taken by shards in use).
        """
        key = CacheKey.of(checksum, size)
        fd = self.store.open_published(key) if self._usable() else None
        if fd is not None:
            os.close(fd)
            return "cached"
        fill = self._start_fill(key, url, inline=True)
        if fill is None:  # someone else is downloading it: follow them to the end
            with self.open(url, size=size, checksum=checksum) as f:
                while f.read(1 << 20):
                    pass
            return "shared" if os.path.exists(self.store.path(key)) else "no room"
        if fill.error is not None:
            raise fill.error
        return "no room" if fill.bypass else "fetched"

    def fetch_manifest(self, url: str) -> bytes:
        """The manifest at ``url``, fetched once per node into the cache dir."""
        src = self.remote.source(url)
        if src is None or not self._usable():
            return self.remote.fetch_manifest(url)
        return fetch_manifest_once(
            self.store, url, src, ttl=self.cfg.manifest_ttl, counters=self.counters
        )

    def stats(self) -> dict[str, float]:
        """This process's counters: requests, bytes fetched, retries, cache hits/misses."""
        return self.counters.snapshot()

    # -- the StreamHost protocol ---------------------------------------------------
    def take_over(self, key: CacheKey, url: str) -> Fill | None:
        fill = self._start_fill(key, url)
        if fill is not None:
            self.counters.add("takeovers")
        return fill

    def direct(self, url: str, start: int, end: int) -> Iterator[bytes]:
        return self._source(url).stream(url, start, end)

    # -- internals -----------------------------------------------------------------
    def _source(self, url: str) -> RangeSource:
        src = self.remote.source(url)
        assert src is not None
        return src

    def _usable(self) -> bool:
        """Whether the cache dir can be used; if not, say why once and read uncached."""
        try:
            self.store.ensure()
        except CacheError as exc:
            if self.cfg.on_cache_error == "raise":
                raise
            local = self._local
            self.counters.add("cache_errors")
            if not local.warned:
                local.warned = True
                log.warning("%s; reading without the cache", exc)
            return False
        return True

    def _start_fill(
        self,
        key: CacheKey,
        url: str,
        *,
        inline: bool = False,
        on_verified: Callable[[], None] | None = None,
    ) -> Fill | None:
        """Start downloading ``key`` here unless someone is at it; the Fill, or None."""
        local = self._local
        with local.lock:
            running = local.fills.get(key.name)
            if running is not None and not running.done:
                return running if not inline else None
            lock_fd = self.store.try_download_lock(key)
            if lock_fd is None:
                return None
            if os.path.exists(self.store.path(key)):
                unlock(lock_fd)  # published while we were looking
                return None
            for name in [n for n, f in local.fills.items() if f.done]:
                del local.fills[name]
            fill = Fill(key, url)
            fill.on_verified = on_verified
            local.fills[key.name] = fill
        gate = self.slots.slot if self.cfg.node_requests else None

        def work() -> None:
            run_fill(
                fill,
                store=self.store,
                stream=lambda: self._source(url).stream(url, 0, key.size, gate=gate),
                lock_fd=lock_fd,
                counters=self.counters,
                raise_cache_errors=self.cfg.on_cache_error == "raise",
            )

        if inline:
            work()
        else:
            name = f"shardkit-fill-{key.digest[:12]}"
            threading.Thread(target=work, name=name, daemon=True).start()
        return fill

    def _prefetch_one(self, key: CacheKey, url: str) -> None:
        """Fetch one shard ahead and lease it, so eviction spares it until it is read.

        The lease is taken on the verified temp file before it is published, so no
        eviction falls in between (its mtime is fresh, yet it may be the only shard
        not in use when the next one needs room).
        """
        local = self._local
        try:
            if not os.path.exists(self.store.path(key)):
                self.counters.add("prefetches")
                keep = functools.partial(self._keep, key, self.store.part_path(key))
                self._start_fill(key, url, inline=True, on_verified=keep)
            self._keep(key, self.store.path(key))  # cached before, or by another process
        except Exception:  # a prefetch is a hint: its reader will meet the error itself
            log.debug("prefetch of %s failed", url, exc_info=True)
        with local.lock:
            local.queued.discard(key.name)
            while len(local.leases) > 2 * max(1, self.cfg.prefetch_depth):
                os.close(local.leases.pop(next(iter(local.leases))))  # the oldest hint

    def _keep(self, key: CacheKey, path: str) -> None:
        """Lease ``path`` for the prefetch of ``key`` unless its reader opened it already.

        Under the lock its reader takes the lease over with, so a prefetch never holds,
        even for a moment, a shard its reader is done with (that shard may be the one the
        next reservation has to evict).
        """
        local = self._local
        with local.lock:
            if key.name in local.queued and key.name not in local.leases:
                fd = self.store.lease(path)
                if fd is not None:
                    local.leases[key.name] = fd

    def _drop_lease(self, key: CacheKey) -> None:
        """The shard is being opened: its reader takes over from a prefetch lease."""
        local = self._local
        with local.lock:
            local.queued.discard(key.name)
            fd = local.leases.pop(key.name, None)
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"CachingOpener(cache_dir={self.store.root!r}, limit={self.store.limit})"
