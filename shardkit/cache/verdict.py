"""The verdict on a filled shard as a whole, and its publishing.

Once every piece of a fill's temp file is verified, one thread of one process (whoever
claims the byte past the piece map first) checks the whole file against the manifest's
checksum and writes the verdict in the map's first byte: a good shard is cut to its size
and published (one process: the key's publish lock), a bad one given up. Every other
reader waits for that verdict, at most ``cache_wait`` seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

from shardkit.cache.download import WriteError, write_at
from shardkit.cache.layout import CacheKey, FillPieces, inode_of
from shardkit.cache.locks import claim_byte, try_lock, unlock
from shardkit.cache.store import CacheStore
from shardkit.counters import Counters
from shardkit.errors import CacheError, ChecksumError
from shardkit.io.config import IoConfig
from shardkit.io.verified import PieceCheck, file_digest

__all__ = ["ShardVerdict", "VerdictHost"]

log = logging.getLogger(__name__)
# the verdict on the whole shard, in the map's first byte (1 there: not checked yet)
_UNCHECKED, _BAD, _GOOD = b"\1", b"\2", b"\3"


class VerdictHost(Protocol):
    """What a verdict needs from its opener: the store, counters and options."""

    store: CacheStore
    counters: Counters
    cfg: IoConfig


class ShardVerdict:
    """The verdict on the whole shard of one fill (see the module docstring).

    Args:
        host: the opener.
        check: what the shard promises; ``key`` and ``layout``: its cache key and pieces.
        close: closes the fill's own lease on the temp file (before a publish or a discard).
        held_off: waits for another process's claim on a byte of the file, as
            ``held_off(fd, byte, timeout, what)``; False once ``timeout`` passed.
    """

    def __init__(
        self,
        host: VerdictHost,
        check: PieceCheck,
        key: CacheKey,
        layout: FillPieces,
        *,
        close: Callable[[], None],
        held_off: Callable[[int, int, float, str], bool],
    ) -> None:
        self.host = host
        self.check = check
        self.key = key
        self.layout = layout
        self.url = check.url
        self._close = close
        self._held_off = held_off
        self._bad: ChecksumError | None = None  # the whole shard, found bad here

    def judge(self, fd: int) -> None:
        """Return once the whole shard of the file ``fd`` (every piece verified) is known
        to match its checksum; decided here if nobody is at it, else waited for (at most
        ``cache_wait`` seconds); :class:`ChecksumError` if it does not match."""
        t0 = time.monotonic()
        wait = self.host.cfg.cache.cache_wait
        at = self.key.size + self.layout.count
        while True:
            verdict = self._decide(fd)
            if verdict in (b"", _GOOD):  # b"": cut to the shard's size, published
                return
            if verdict == _BAD:
                raise self.error()
            left = wait - (time.monotonic() - t0)
            if left <= 0 or not self._held_off(fd, at, left, "the whole shard's check"):
                raise CacheError(
                    f"{self.url}: waited {time.monotonic() - t0:.0f} s for another fill to "
                    f"check the whole shard (cache_wait={wait:g})"
                )

    def finish(self, fd: int) -> ChecksumError | None:
        """Decide on the fill's own lease ``fd`` (every piece verified; closed before a
        publish); the error if the whole shard does not match."""
        return self.error() if self._decide(fd, own=True) == _BAD else None

    def error(self) -> ChecksumError:
        """Why the whole shard was found bad (here, or by another process)."""
        return self._bad or self.check.whole_error(None)

    def _decide(self, fd: int, *, own: bool = False) -> bytes | None:
        """The verdict on the whole shard of the file ``fd`` (every piece verified):
        ``_GOOD``, ``_BAD``, or ``b""`` (cut: published); decided here if nobody has yet
        (a good shard is published, a bad one given up); None while another thread or
        process decides. ``own``: ``fd`` is this fill's lease, closed before a publish."""
        claim = claim_byte(fd, self.key.size + self.layout.count)  # a lock past the map
        if claim is None:
            return None
        try:
            verdict = os.pread(claim, 1, self.key.size)
            if verdict == _GOOD:  # decided meanwhile, maybe not published (lock busy, died)
                self._publish(claim, own)
            if verdict != _UNCHECKED:
                return None if verdict == b"\0" else verdict
            store, key = self.host.store, self.key
            actual = key.digest
            if self.layout.digests is not None:  # else the one piece was checked whole
                actual = file_digest(claim, key.size, key.algo)
            if actual != key.digest:
                self.host.counters.add("checksum_failures")
                write_at(claim, _BAD, key.size, store)
                self._bad = self.check.whole_error(actual)
                log.warning("%s: not cached: %s", self.url, self._bad)
                if own:
                    self._close()  # this fill's lease: only readers may keep the file a while
                store.discard(key, self.layout)
                return _BAD
            write_at(claim, _GOOD, key.size, store)
            self._publish(claim, own)
            return _GOOD
        finally:
            unlock(claim)

    def _publish(self, claim: int, own: bool) -> None:
        """Cut the temp file (verdict good) to the shard and make it visible."""
        store, key = self.host.store, self.key
        lock = try_lock(store.lock_path(key))
        if lock is None:  # another temp file of this shard is being published
            return
        try:
            part = store.part_path(key, self.layout)
            if os.path.exists(store.path(key)) or inode_of(part) != os.fstat(claim).st_ino:
                return  # published, or given up, by someone else
            try:
                os.ftruncate(claim, key.size)
                os.fsync(claim)
            except OSError as exc:
                raise WriteError(f"cache dir {store.root}: cannot publish: {exc}") from exc
            if own:
                self._close()  # before the publish: once visible, only its readers hold it
            try:
                if store.publish(key, self.layout):
                    self.host.counters.add("cache_fills")
            except OSError as exc:  # verified all the same: its readers go on reading it
                self.host.counters.add("cache_errors")
                log.warning("%s: cache dir %s: cannot publish: %s", self.url, store.root, exc)
        finally:
            unlock(lock)
