"""Re-verifying a cached shard as it is opened (``IoConfig(cache_verify="open")``): disk rot
is caught before a byte of it reaches a reader.

With pieces in the manifest, :class:`RecheckedHit` hashes each piece a reader comes to
before handing out any of its bytes, so a reader starts as soon as its own first piece is
checked and a ranged read checks only the pieces it covers. Without pieces the whole shard
is hashed at open (:func:`whole_matches`). A shard that does not match is evicted (renamed
out of ``data/`` if another process still reads it) and named in a warning and the
``cache_rotten`` counter; the reader goes on from a fresh copy, fetched again through the
cache and verified as any fill is.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from typing import BinaryIO

from shardkit.cache.layout import CacheKey, Layout
from shardkit.counters import Counters
from shardkit.format.checksum import new_hasher
from shardkit.format.pieces import PIECE_ALGORITHM

__all__ = ["RecheckedHit", "report_rot", "whole_matches"]

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


def digest_of(fd: int, hi: int, algo: str, *, start: int = 0) -> str:
    """The digest of the bytes ``[start, hi)`` of the file ``fd``, read through one small
    buffer (a fresh large one per read costs more in page faults than the hash itself)."""
    h = new_hasher(algo)
    view = memoryview(bytearray(_CHUNK))
    pos = start
    while pos < hi:
        n = os.preadv(fd, [view[: min(_CHUNK, hi - pos)]], pos)
        if n == 0:
            break
        h.update(view[:n])
        pos += n
    return h.hexdigest()


def whole_matches(fd: int, key: CacheKey) -> bool:
    """Whether the cached file ``fd`` still matches the checksum it is cached under."""
    return digest_of(fd, key.size, key.algo) == key.digest


def report_rot(counters: Counters, url: str, what: str) -> None:
    counters.add("cache_rotten")
    log.warning("%s: the cached copy rotted on disk (%s); evicted, fetched again", url, what)


class RecheckedHit(io.RawIOBase):
    """``[start, end)`` of a cached shard ``fd``, each piece checked before it is read.

    Args:
        fd: the cached file, under its reader's lease (closed by ``let_go``).
        layout: the shard's pieces (``digests`` set).
        rotten: called with ``fd`` and the piece when a piece does not match: closes
            ``fd`` and evicts the shard.
        reopen: a fresh stream of ``[pos, end)`` once the shard is evicted.
    """

    def __init__(
        self,
        fd: int,
        layout: Layout,
        start: int,
        end: int,
        *,
        rotten: Callable[[int, int], None],
        reopen: Callable[[int], BinaryIO],
        let_go: Callable[[int], None],  # closes ``fd`` when the reader is done
    ) -> None:
        assert layout.digests is not None
        self._fd: int | None = fd
        self._layout = layout
        self._digests = layout.digests
        self._pos = start
        self._end = end
        self._ok = -1
        self._rotten = rotten
        self._reopen = reopen
        self._let_go = let_go
        self._rest: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._rest is None and self._fd is not None and self._pos < self._end:
            k = self._layout.piece_of(self._pos)
            lo, hi = self._layout.span(k)
            if (
                k != self._ok
                and digest_of(self._fd, hi, PIECE_ALGORITHM, start=lo) != self._digests[k]
            ):
                fd, self._fd = self._fd, None
                self._rotten(fd, k)
                self._rest = self._reopen(self._pos)
            else:
                self._ok = k
                want = memoryview(b)[: min(self._end, hi) - self._pos]
                n = os.preadv(self._fd, [want], self._pos)
                self._pos += n
                return n
        if self._rest is None:
            return 0
        n = int(self._rest.readinto(memoryview(b)[: self._end - self._pos]))  # type: ignore[attr-defined]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            fd, self._fd = self._fd, None
            if fd is not None:
                self._let_go(fd)
            if self._rest is not None:
                self._rest.close()
        super().close()
