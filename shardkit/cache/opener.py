"""The caching opener: remote shards through the node-local cache.

``open(ref, start, end)`` of a remote shard is served from the cache when
the shard is there (a hit, under a lease). On a miss it is read from the shard's temp file
as it fills, piece by piece, each piece verified before a byte of it is handed out (see
:mod:`shardkit.cache.fill`): every process on the node that wants the shard fetches the
pieces nobody else is fetching, the ones its reader needs first. ``prefetch`` fills the
next shards of a plan in a small thread pool, ``prefetch_depth`` ahead. Reads without a
size and checksum (a manifest) and local files bypass the cache.

The opener is cheap to build and picklable: its threads, locks and fill registry are a
:class:`~shardkit.per_process.PerProcess` resource, made on first use (again after a fork).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from shardkit._types import ObjectRef
from shardkit.cache.fill import ShardFill
from shardkit.cache.gate import NodeGate
from shardkit.cache.layout import CacheKey, FillPieces
from shardkit.cache.manifests import fetch_manifest_once
from shardkit.cache.opener_process import OpenerProcess
from shardkit.cache.store import CacheStore
from shardkit.cache.stream import CacheStream
from shardkit.counters import Counters
from shardkit.errors import CacheError, ChecksumError, ConfigError
from shardkit.io.config import IoConfig
from shardkit.io.remote import RangeFetcher, UncachedOpener, buffered
from shardkit.io.verified import VerifiedFile, file_digest
from shardkit.per_process import PerProcess
from shardkit.urls import REMOTE_SCHEMES, url_scheme

__all__ = ["CachingOpener"]

log = logging.getLogger(__name__)


class CachingOpener:
    """Reads remote shards through the node-local cache (see the module docstring).

    Args:
        cfg: the io options; ``cfg.cache.cache_dir`` must be set.
        remote: the uncached opener underneath (made from ``cfg`` if not given).
    """

    def __init__(self, cfg: IoConfig, remote: UncachedOpener | None = None) -> None:
        if cfg.cache.cache_dir is None:
            raise CacheError("a caching opener needs a cache_dir")
        self.cfg = cfg
        self.remote = remote or UncachedOpener(cfg)
        self.counters = self.remote.counters
        self.store = CacheStore(cfg.cache.cache_dir, cfg.cache.cache_limit)
        self.gate = NodeGate(cfg, self.store.root, self.counters)
        self._locals: PerProcess[OpenerProcess] = PerProcess(
            functools.partial(OpenerProcess, cfg.cache.prefetch_threads)
        )

    @property
    def _local(self) -> OpenerProcess:
        return self._locals.get()

    # -- the Opener protocol -------------------------------------------------------
    def open(self, ref: ObjectRef, start: int = 0, end: int | None = None) -> BinaryIO:
        """Stream ``[start, end)`` of ``ref``, through the cache when it can be cached (a
        remote object with a size and checksum); else as the uncached opener does."""
        if ref.size is None or ref.checksum is None or self.remote.fetcher(ref.url) is None:
            return self.remote.open(ref, start, end)
        stop = ref.size if end is None else min(end, ref.size)
        return self._open_ref(ref, start, stop)

    def _open_ref(self, ref: ObjectRef, start: int, stop: int) -> BinaryIO:
        """``[start, stop)`` of the remote shard ``ref`` (size and checksum known)."""
        assert ref.size is not None and ref.checksum is not None
        key = CacheKey.of(ref.checksum, ref.size)
        if not self._usable():
            return self.remote.open(ref, start, stop)
        layout = FillPieces.of(ref.size, ref.pieces)
        try:
            fd, published = self._open_part(key, layout)
        except CacheError as exc:
            if self.cfg.cache.on_cache_error == "raise":
                raise
            self.counters.add("cache_errors")
            log.warning("%s (reading %s uncached)", exc, ref.url)
            fd, published = None, False
        self._drop_lease(key)  # the reader holds its own lease from here
        if fd is None:
            self.counters.add("cache_no_room")
            return self.remote.open(ref, start, stop)
        if published:
            if os.fstat(fd).st_size != ref.size:
                return self._other_size(key, ref, start, stop, fd)
            with contextlib.suppress(OSError):
                os.utime(fd)  # least recently used goes first
            self.counters.add("cache_hits")
            if self.cfg.cache.cache_verify == "open":
                return self._rechecked(key, ref, start, stop, layout, fd)
            return buffered(CacheStream(self, key, ref.url, start, stop, fd=fd))
        self.counters.add("cache_misses")
        fill = self._fill_for(ref, layout, fd)
        return buffered(CacheStream(self, key, ref.url, start, stop, fd=fd, fill=fill))

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        with self.open(ObjectRef(url), start, end) as f:
            return f.read()

    def prefetch(self, refs: Sequence[ObjectRef]) -> None:
        """Fill the first ``prefetch_depth`` of these next shards in the background."""
        if not self._usable():
            return
        local = self._local
        for ref in refs[: self.cfg.cache.prefetch_depth]:
            if not ref.verifiable or url_scheme(ref.url) not in REMOTE_SCHEMES:
                continue
            assert ref.size is not None and ref.checksum is not None
            try:
                key = CacheKey.of(ref.checksum, ref.size)
            except ConfigError:
                continue  # a hint only: its open() reports the bad checksum
            layout = FillPieces.of(ref.size, ref.pieces)
            with local.lock:
                running = local.fills.get(self.store.part_path(key, layout))
                busy = key.name in local.queued or key.name in local.leases
                if busy or (running is not None and not running.done.is_set()):
                    continue
                local.queued.add(key.name)
            local.submit(functools.partial(self._prefetch_one, key, ref, layout))

    def ensure_cached(self, ref: ObjectRef) -> str:
        """Put one shard in the cache now (``shardkit cache warm``); what happened:
        ``"cached"`` (it was there), ``"fetched"`` or ``"no room"`` (the limit is taken by
        shards in use).
        """
        if ref.size is None or ref.checksum is None:
            raise ConfigError(f"{ref.url}: caching a shard needs its size and checksum")
        key, layout = CacheKey.of(ref.checksum, ref.size), FillPieces.of(ref.size, ref.pieces)
        fd, published = self._open_part(key, layout)
        if fd is None:
            return "no room"
        try:
            if published:
                return "cached"
            fill = self._fill_for(ref, layout, fd)
            fill.start(0)
            fill.done.wait()
            if fill.error is not None:
                raise fill.error
            for k in range(layout.count):  # verified, and the whole checked (maybe elsewhere)
                fill.need(fd, k)
        finally:
            self.store.let_go(fd, key, layout)
        return "fetched" if os.path.exists(self.store.path(key)) else "no room"

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until this process's background work has ended (prefetches, and fills its
        readers left running), then release the shards prefetched and not read (their
        leases keep eviction off them). The opener can be used again afterwards. False if
        ``timeout`` seconds passed first (the leases are released all the same).
        """
        local = self._locals.peek()
        if local is None:
            return True
        end = None if timeout is None else time.monotonic() + timeout
        ended = local.wait_idle(timeout)
        with local.lock:
            fills = list(local.fills.values())
        for fill in fills:
            left = None if end is None else max(0.0, end - time.monotonic())
            ended = fill.done.wait(left) and ended
        with local.lock:
            leases, local.leases = list(local.leases.values()), {}
            # a prefetch still running lets its lease go when it ends: nothing wants it now
            local.queued.clear()
        for fd in leases:
            os.close(fd)
        return ended

    def fetch_manifest(self, url: str) -> bytes:
        """The manifest at ``url``, fetched once per node into the cache dir."""
        src = self.remote.fetcher(url)
        if src is None or not self._usable():
            return self.remote.fetch_manifest(url)
        return fetch_manifest_once(
            self.store, url, src, ttl=self.cfg.cache.manifest_ttl, counters=self.counters
        )

    def stats(self) -> dict[str, float]:
        """This process's counters: requests, bytes fetched, retries, cache hits/misses."""
        return self.counters.snapshot()

    # -- what a fill and a stream ask of their opener ----------------------------
    def fetch(self, url: str, start: int, end: int, *, urgent: bool = False) -> Iterator[bytes]:
        """The remote bytes ``[start, end)``, each request under the node's request cap
        (``urgent``: a reader waits for them, see :class:`NodeSlots`)."""
        return self._fetcher(url).stream(
            url, start, end, gate=functools.partial(self.gate.turn, urgent)
        )

    # -- internals -----------------------------------------------------------------
    def _fetcher(self, url: str) -> RangeFetcher:
        src = self.remote.fetcher(url)
        assert src is not None
        return src

    def _usable(self) -> bool:
        """Whether the cache dir can be used; if not, say why once and read uncached."""
        try:
            self.store.ensure()
        except CacheError as exc:
            if self.cfg.cache.on_cache_error == "raise":
                raise
            local = self._local
            self.counters.add("cache_errors")
            if not local.warned:
                local.warned = True
                log.warning("%s; reading without the cache", exc)
            return False
        return True

    def _open_part(self, key: CacheKey, layout: FillPieces) -> tuple[int | None, bool]:
        try:
            return self.store.open_part(key, layout)
        except OSError as exc:
            raise CacheError(f"cache dir {self.store.root}: cannot reserve: {exc}") from exc

    def _other_size(
        self, key: CacheKey, ref: ObjectRef, start: int, stop: int, fd: int
    ) -> BinaryIO:
        """A cached shard whose size is not the manifest's: if its bytes still match the
        checksum it is cached under, the manifest is wrong (a ChecksumError, the shard
        stays); else the copy changed on disk: evicted, reported, fetched again."""
        try:
            size = os.fstat(fd).st_size
            intact = whole_matches(fd, CacheKey(key.algo, key.digest, size))
        finally:
            os.close(fd)
        if intact:
            raise ChecksumError(
                f"the manifest says {ref.size} bytes but the shard with this checksum has {size}",
                url=ref.url,
                expected=f"{ref.size} bytes",
                actual=f"{size} bytes",
            )
        self.store.evict_rotten(key)
        report_rot(self.counters, ref.url, f"{size} bytes instead of {ref.size}")
        return self._open_ref(ref, start, stop)

    def _rechecked(
        self, key: CacheKey, ref: ObjectRef, start: int, stop: int, layout: FillPieces, fd: int
    ) -> BinaryIO:
        """A cache hit hashed again as it is read (``cache_verify="open"``): each piece a
        reader comes to before any of its bytes (:class:`VerifiedFile`), or without pieces
        the whole shard at open; a rotten copy is evicted, named in a warning and the
        ``cache_rotten`` counter, and the reader goes on from a fresh copy."""

        def rotten(what: str) -> None:
            self.store.evict_rotten(key)
            report_rot(self.counters, ref.url, what)

        if layout.digests is None:
            if whole_matches(fd, key):
                return buffered(CacheStream(self, key, ref.url, start, stop, fd=fd))
            os.close(fd)
            rotten("whole shard")
            return self._open_ref(ref, start, stop)
        f = io.FileIO(fd, "rb")  # the lease: closed with the stream

        def on_bad(pos: int, error: ChecksumError) -> BinaryIO:
            f.close()
            rotten(str(error).split(" differs")[0])
            return self._open_ref(ref, pos, stop)

        return buffered(VerifiedFile(f, ref, start=start, end=stop, on_bad=on_bad))

    def _fill_for(self, ref: ObjectRef, layout: FillPieces, fd: int) -> ShardFill:
        """This process's fill of ``ref`` (shared by its readers), started on the file
        ``fd`` (a lease of its own on it) if none is running."""
        assert ref.size is not None and ref.checksum is not None
        local = self._local
        name = self.store.part_path(CacheKey.of(ref.checksum, ref.size), layout)
        with local.lock:
            running = local.fills.get(name)
            if running is not None and not running.done.is_set():
                return running
            for done in [n for n, f in local.fills.items() if f.done.is_set()]:
                del local.fills[done]
            fill = ShardFill(self, ref, os.dup(fd))
            local.fills[name] = fill
        return fill

    def _prefetch_one(self, key: CacheKey, ref: ObjectRef, layout: FillPieces) -> None:
        """Fill one shard ahead and lease it, so eviction spares it until it is read.

        The prefetch holds its lease on the temp file from before its first piece, so the
        shard is leased when it is published (no eviction falls in between: its mtime is
        fresh, yet it may be the only shard not in use when the next one needs room).
        """
        local = self._local
        try:
            with local.lock:
                wanted = key.name in local.queued
            # else its reader opened it first: it may even be read and evicted by now
            fd, published = self._open_part(key, layout) if wanted else (None, False)
            if fd is not None:
                fill = None if published else self._fill_for(ref, layout, fd)
                self._keep(key, fd)  # from now on its reader may take it over
                if fill is not None:  # its own threads fill it: this one goes on to the next
                    self.counters.add("prefetches")
                    fill.start(0)
        except Exception:  # a prefetch is a hint: its reader will meet the error itself
            log.debug("prefetch of %s failed", ref.url, exc_info=True)
        with local.lock:
            local.queued.discard(key.name)
            while len(local.leases) > 2 * max(1, self.cfg.cache.prefetch_depth):
                os.close(local.leases.pop(next(iter(local.leases))))  # the oldest hint

    def _keep(self, key: CacheKey, fd: int) -> None:
        """Keep the lease ``fd`` for the prefetch of ``key`` unless its reader opened it
        already (then close it).

        Under the lock its reader takes the lease over with, so a prefetch never holds,
        even for a moment, a shard its reader is done with (that shard may be the one the
        next reservation has to evict).
        """
        local = self._local
        with local.lock:
            if key.name in local.queued and key.name not in local.leases:
                local.leases[key.name] = fd
                return
        os.close(fd)

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


def whole_matches(fd: int, key: CacheKey) -> bool:
    """Whether the cached file ``fd`` still matches the checksum it is cached under."""
    return file_digest(fd, key.size, key.algo) == key.digest


def report_rot(counters: Counters, url: str, what: str) -> None:
    """A cached copy that no longer matches: counted, named, evicted, fetched again."""
    counters.add("cache_rotten")
    log.warning("%s: the cached copy rotted on disk (%s); evicted, fetched again", url, what)
