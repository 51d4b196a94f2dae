"""One download of a shard into the cache: temp file, verify, publish (or not).

The process holding a shard's download lock runs :func:`run_fill` in a thread. Bytes go to
the temp file as they arrive, so readers in any process read along; the whole is checked
against the manifest's size and checksum before ``os.replace`` makes it visible. A
mismatch is fetched once more, then it is a :class:`ChecksumError` and nothing is
published. A write that fails (a full disk) is a :class:`CacheError`: logged, and the
readers go on without the cache, or it is raised (``on_cache_error="raise"``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from shardkit.cache.locks import unlock
from shardkit.cache.store import CacheKey, CacheStore
from shardkit.checksum import new_hasher
from shardkit.errors import CacheError, ChecksumError, FetchError
from shardkit.io.retry import Counters

__all__ = ["Fill", "run_fill"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

Stream = Callable[[], Iterator[bytes]]
"""Opens the remote bytes ``[0, size)`` of the shard being filled."""


class Fill:
    """The state of a download this process runs, watched by its readers.

    ``inode`` is the temp file being written, ``written`` how many bytes it holds;
    ``bypass`` says the shard will not be cached (no room, a write error) and readers
    should read remotely; ``error`` is what readers raise. ``on_verified`` is called
    once the temp file is verified and closed, before it is published (a prefetch leases
    it there, so no eviction can fall between the publish and its lease).
    """

    def __init__(self, key: CacheKey, url: str) -> None:
        self.key = key
        self.url = url
        self.cond = threading.Condition()
        self.inode: int | None = None
        self.written = 0
        self.done = False
        self.bypass = False
        self.error: BaseException | None = None
        self.on_verified: Callable[[], None] | None = None

    def update(self, **changes: object) -> None:
        with self.cond:
            for name, value in changes.items():
                setattr(self, name, value)
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Wait until something changes (or ``timeout`` seconds)."""
        with self.cond:
            self.cond.wait(timeout)


def run_fill(
    fill: Fill,
    *,
    store: CacheStore,
    stream: Stream,
    lock_fd: int,
    counters: Counters,
    raise_cache_errors: bool,
) -> None:
    """Download ``fill.key`` into the cache, holding its download lock (released here)."""
    try:
        actual = ""
        for attempt in (1, 2):
            verified, actual = _attempt(fill, store, stream, counters)
            if verified:
                return
            log.warning(
                "%s: checksum mismatch (expected %s, got %s), attempt %d of 2",
                fill.url,
                fill.key.checksum,
                actual,
                attempt,
            )
        raise ChecksumError(
            "downloaded twice, both differ from the manifest; not cached",
            url=fill.url,
            expected=fill.key.checksum,
            actual=actual,
        )
    except CacheError as exc:
        counters.add("cache_errors")
        log.warning("%s (reading %s uncached)", exc, fill.url)
        fill.update(**({"error": exc} if raise_cache_errors else {"bypass": True}))
    except (FetchError, ChecksumError) as exc:
        fill.update(error=exc)
    except BaseException as exc:  # a bug: let the readers see it rather than hang
        fill.update(error=exc)
        raise
    finally:
        unlock(lock_fd)
        fill.update(done=True)


def _attempt(fill: Fill, store: CacheStore, stream: Stream, counters: Counters) -> tuple[bool, str]:
    """One download into a fresh temp file; ``(published, actual checksum)``."""
    key = fill.key
    try:
        fd = store.reserve(key)
    except OSError as exc:
        raise CacheError(f"cache dir {store.root}: cannot reserve: {exc.strerror}") from exc
    if fd is None:
        counters.add("cache_no_room")
        fill.update(bypass=True)
        return True, key.checksum
    try:
        try:
            inode = os.fstat(fd).st_ino
            fill.update(inode=inode, written=0)
            n, actual = _download(fill, stream, fd, store)
            verified = n == key.size and actual == key.checksum
            if verified:
                _publishing(store, os.fsync, fd)
        finally:
            os.close(fd)  # before the publish: once visible, only its readers hold the shard
        if verified:
            if fill.on_verified is not None:
                fill.on_verified()
            _publishing(store, store.publish, key)
    except BaseException:
        with contextlib.suppress(OSError, CacheError):  # else the next reservation does it
            store.discard(key)
        raise
    if verified:
        counters.add("cache_fills")
        return True, actual
    counters.add("checksum_failures")
    store.mark_failed(key, inode, actual if n == key.size else f"{n} bytes")
    return False, actual


def _download(fill: Fill, stream: Stream, fd: int, store: CacheStore) -> tuple[int, str]:
    """Write the remote bytes to ``fd``; ``(bytes written, their checksum)``."""
    hasher = new_hasher(fill.key.algo)
    n = 0
    for chunk in stream():
        _write_all(fd, chunk, store)
        hasher.update(chunk)
        n += len(chunk)
        fill.update(written=n)
    return n, f"{fill.key.algo}:{hasher.hexdigest()}"


def _publishing(store: CacheStore, step: Callable[[_T], None], arg: _T) -> None:
    try:
        step(arg)
    except OSError as exc:
        raise CacheError(f"cache dir {store.root}: cannot publish: {exc}") from exc


def _write_all(fd: int, data: bytes, store: CacheStore) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise CacheError(
            f"cache dir {store.root}: cannot write ({exc.strerror}); the disk may be full"
        ) from exc
