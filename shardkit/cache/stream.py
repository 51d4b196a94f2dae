"""Reading a shard from the cache: its verified file, or a fill's temp file piece by piece.

A :class:`CacheStream` reads ``[start, end)`` of one shard. Given a published file (a hit)
it simply reads it. Given a fill's temp file it reads a piece only once the piece map says
it is verified (:meth:`ShardFill.need` fetches it here or waits for whoever does), so no
unverified byte reaches the reader; the file is the same inode when it is published, so
reading goes on across the publish. If the cache cannot write (a full disk) and
``on_cache_error`` is ``"bypass"``, the rest of the range is read straight from the remote,
verified as the uncached opener verifies it (:func:`~shardkit.io.remote.verified_stream`).

Every file is read under a lease (a shared ``flock``) that keeps eviction off it.
"""

from __future__ import annotations

import io
import logging
import os
from typing import BinaryIO

from shardkit.cache.download import WriteError
from shardkit.cache.fill import FillHost, ShardFill
from shardkit.cache.layout import CacheKey
from shardkit.errors import CacheError, ChecksumError
from shardkit.io.remote import verified_stream

__all__ = ["CacheStream"]

log = logging.getLogger(__name__)


class CacheStream(io.RawIOBase):
    """``[start, end)`` of a shard from the file ``fd`` (leased; see the module docstring).

    With ``fill`` None, ``fd`` is the verified shard; else it is the fill's temp file.
    """

    def __init__(
        self,
        host: FillHost,
        key: CacheKey,
        url: str,
        start: int,
        end: int,
        *,
        fd: int,
        fill: ShardFill | None = None,
    ) -> None:
        self._host = host
        self._key = key
        self._url = url
        self._pos = start
        self._end = end
        self._fd: int | None = fd
        self._fill = fill
        self._ok = -1  # the piece last seen verified
        self._uncached: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b)[: max(0, self._end - self._pos)]
        if not view:
            return 0
        if self._uncached is not None:
            n = int(self._uncached.readinto(view))  # type: ignore[attr-defined]
            self._pos += n
            return n
        assert self._fd is not None
        stop = self._end
        fill = self._fill
        if fill is not None:
            k = fill.check.piece_of(self._pos)
            if k != self._ok:
                try:
                    fill.need(self._fd, k)
                except WriteError as exc:
                    if self._host.cfg.cache.on_cache_error == "raise":
                        raise
                    self._go_uncached(exc)
                    return self.readinto(b)
                self._ok = k
            stop = min(stop, fill.check.span(k)[1])
        n = os.preadv(self._fd, [view[: stop - self._pos]], self._pos)
        if n == 0:
            raise ChecksumError(
                f"the cached file ends before byte {self._end}",
                url=self._url,
                expected=f"{self._key.size} bytes",
            )
        self._pos += n
        return n

    def _go_uncached(self, exc: CacheError) -> None:
        self._host.counters.add("cache_errors")
        log.warning("%s (reading %s uncached)", exc, self._url)
        assert self._fill is not None  # a write error comes from a fill
        self._uncached = verified_stream(
            lambda lo, hi: self._host.fetch(self._url, lo, self._end if hi is None else hi),
            self._fill.ref,
            self._pos,
            self._end,
            self._host.counters,
        )
        self._let_go()

    def _let_go(self) -> None:
        """Close the file; a temp file given up while it was read can be removed now."""
        fd, self._fd = self._fd, None
        if fd is not None:
            self._host.store.let_go(fd, self._key, self._fill.layout if self._fill else None)

    def close(self) -> None:
        if not self.closed:
            self._let_go()
            if self._uncached is not None:
                self._uncached.close()
        super().close()
