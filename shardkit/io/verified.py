"""Ranged reads verified piece by piece, for a shard the node cache cannot hold.

A :class:`PieceStream` serves ``[start, end)`` of a remote shard whose manifest lists piece
checksums: it fetches the whole pieces that cover the range (one ranged request from the
first piece's start to the last one's end), holds each piece until it matches its digest,
and only then hands out the part of it inside the range. A piece that does not match is
fetched once more; twice is a :class:`ChecksumError` naming the shard and the piece. So no
unverified byte reaches a reader, at the cost of up to one piece of memory per stream and
up to a piece read beyond each end of the range. A read of the whole shard is also checked
against the shard's ``checksum`` at its end (the pieces catch corruption; the checksum
names the content).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

from shardkit._types import PieceChecksums
from shardkit.counters import Counters
from shardkit.errors import ChecksumError
from shardkit.format.checksum import split_checksum
from shardkit.format.digest import Digest
from shardkit.format.pieces import PIECE_ALGORITHM, piece_digest

__all__ = ["PieceStream"]

log = logging.getLogger(__name__)

Fetch = Callable[[int, int], Iterator[bytes]]


class PieceStream(io.RawIOBase):
    """``[start, end)`` of the shard ``url`` (``size`` bytes), verified piece by piece.

    ``fetch(lo, hi)`` streams the remote bytes ``[lo, hi)``.
    """

    def __init__(
        self,
        fetch: Fetch,
        *,
        url: str,
        start: int,
        end: int,
        size: int,
        pieces: PieceChecksums,
        checksum: str | None = None,
        counters: Counters | None = None,
    ) -> None:
        self._fetch = fetch
        self._url = url
        self._pos = start
        self._end = min(end, size)
        self._size = size
        self._pieces = pieces
        self._counters = counters
        self._k = start // pieces.size  # the next piece to verify
        self._chunks: Iterator[bytes] | None = None
        self._at = 0  # where the stream of chunks stands
        self._left = memoryview(b"")  # bytes of its last chunk not taken yet
        self._data = memoryview(b"")  # verified bytes of the piece, from self._pos on
        whole = checksum is not None and start == 0 and self._end == size
        self._checksum = checksum if whole else None
        self._digest = Digest(split_checksum(checksum)[0]) if whole and checksum else None

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._pos >= self._end:
            return 0
        if not self._data:
            self._next_piece()
        n = min(len(b), len(self._data), self._end - self._pos)
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        self._pos += n
        return n

    def _span(self, k: int) -> tuple[int, int]:
        lo = k * self._pieces.size
        return lo, min(lo + self._pieces.size, self._size)

    def _next_piece(self) -> None:
        k = self._k
        lo, hi = self._span(k)
        want = self._pieces.digests[k]
        got = ""
        for attempt in (1, 2):
            data = self._read_piece(lo, hi, fresh=attempt > 1)
            got = piece_digest(data) if len(data) == hi - lo else f"{len(data)} of {hi - lo} bytes"
            if got == want:
                if self._digest is not None:
                    self._digest.update(data)
                    if hi == self._size:
                        self._check_whole()
                self._k += 1
                self._data = memoryview(data)[self._pos - lo :]
                if self._counters is not None:
                    self._counters.add("pieces_verified")
                return
            if self._counters is not None:
                self._counters.add("checksum_failures")
            log.warning(
                "%s: piece %d (bytes %d..%d) differs from the manifest, attempt %d of 2",
                self._url,
                k,
                lo,
                hi,
                attempt,
            )
        raise ChecksumError(
            f"piece {k} (bytes {lo}..{hi}) differs from the manifest twice; not read",
            url=self._url,
            expected=f"{PIECE_ALGORITHM}:{want}",
            actual=f"{PIECE_ALGORITHM}:{got}" if " " not in got else got,
        )

    def _check_whole(self) -> None:
        assert self._digest is not None and self._checksum is not None
        algo, want = split_checksum(self._checksum)
        got = self._digest.hasher.hexdigest()
        if got != want:
            raise ChecksumError(
                "every piece matches the manifest's piece checksums but the whole shard "
                "does not match its checksum: the pieces listed are not this shard's",
                url=self._url,
                expected=self._checksum,
                actual=f"{algo}:{got}",
            )

    def _read_piece(self, lo: int, hi: int, *, fresh: bool) -> bytearray:
        """The bytes ``[lo, hi)`` (fewer if the answer ends early): from the running
        request (one covers every piece of the range), or for a second attempt from a
        request of their own (the running one goes on with the next piece)."""
        if fresh:
            chunks = self._fetch(lo, hi)
            try:
                return bytearray().join(chunks)
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
        if self._chunks is None or self._at != lo:
            self._close_chunks()
            self._chunks = self._fetch(lo, self._span((self._end - 1) // self._pieces.size)[1])
            self._at = lo
        buf = bytearray()
        while self._at < hi:
            if not self._left:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._left = memoryview(chunk)
            take = min(len(self._left), hi - self._at)
            buf += self._left[:take]
            self._left = self._left[take:]
            self._at += take
        return buf

    def _close_chunks(self) -> None:
        chunks, self._chunks = self._chunks, None
        self._left = memoryview(b"")
        close = getattr(chunks, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        if not self.closed:
            self._close_chunks()
        super().close()
