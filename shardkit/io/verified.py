"""One verifier for every read that checks pieces: what an :class:`ObjectRef` promises.

:class:`PieceCheck` is the single place that knows what a shard's bytes must hash to: each
piece against its xxh3-128 digest (or, for a manifest without pieces, one piece, the whole
shard, against its checksum) and the whole shard against its checksum, with the
:class:`ChecksumError` that names the shard, the piece and its bytes. The node cache's
fill, its re-check of a hit (``cache_verify="open"``), the uncached ranged reads below and
local files all check through it.

Two readers are built on it:

- :class:`VerifiedFile` serves ``[start, end)`` of a seekable file (a local shard, a
  cached one): it reads each piece the range touches whole, checks it, and only then
  hands out the part inside the range; a read of the whole shard is also checked against
  its checksum at its end;
- :class:`PieceStream` does the same over a remote byte stream (one ranged request from
  the first piece's start to the last one's end), fetching a piece that does not match
  once more before it raises.

Either holds at most one piece in memory and reads up to a piece beyond each end of the
range: no unverified byte ever reaches a reader. (Where the manifest vouches for each
sample's digest, a plain tar is checked sample by sample instead:
:mod:`shardkit.io.verified_samples`.)
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import BinaryIO

from shardkit._types import ObjectRef
from shardkit.counters import Counters
from shardkit.errors import ChecksumError, ConfigError
from shardkit.format.checksum import Hasher, new_hasher, split_checksum
from shardkit.format.pieces import PIECE_ALGORITHM, piece_count

__all__ = [
    "PieceCheck",
    "PieceStream",
    "VERIFY_TIME",
    "VerifiedFile",
    "file_digest",
    "timed_hasher",
]

log = logging.getLogger(__name__)

Fetch = Callable[[int, int], Iterator[bytes]]
_CHUNK = 1 << 20
# seconds this process spent hashing what it reads (``verify_s``), in any thread: the
# loader's ``time_verify_s``
VERIFY_TIME = Counters()


class _TimedHasher:
    """A hasher that adds the seconds its work took to :data:`VERIFY_TIME`."""

    __slots__ = ("_h",)

    def __init__(self, h: Hasher) -> None:
        self._h = h

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        t = perf_counter()
        self._h.update(data)
        VERIFY_TIME.add("verify_s", perf_counter() - t)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def timed_hasher(algo: str) -> Hasher:
    """A fresh hasher for ``algo`` whose time counts as verification."""
    return _TimedHasher(new_hasher(algo))


def file_digest(fd: int, end: int, algo: str, *, start: int = 0) -> str:
    """The digest of the bytes ``[start, end)`` of the file ``fd``, read through one small
    buffer (a fresh large one per read costs more in page faults than the hash itself)."""
    h = timed_hasher(algo)
    view = memoryview(bytearray(_CHUNK))
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[: min(_CHUNK, end - pos)]], pos)
        if n == 0:
            break
        h.update(view[:n])
        pos += n
    return h.hexdigest()


class PieceCheck:
    """What ``ref`` promises about its bytes, checked piece by piece and whole.

    Args:
        ref: the object; ``size`` and ``checksum`` must be set (``pieces`` may not be:
            then the shard is one piece, checked by its checksum).
    """

    def __init__(self, ref: ObjectRef) -> None:
        if ref.size is None or ref.checksum is None:
            raise ConfigError(f"{ref.url}: a verified read needs the size and checksum")
        self.ref = ref
        self.url = ref.url
        self.size = ref.size
        self.checksum = ref.checksum
        self.algo, self.digest = split_checksum(ref.checksum)
        pieces = ref.pieces if ref.size else None
        self.piece_size = pieces.size if pieces is not None else 0
        self.digests = pieces.digests if pieces is not None else None
        self.count = piece_count(self.size, self.piece_size) if self.piece_size else 1
        if self.digests is not None and len(self.digests) != self.count:
            raise ChecksumError(
                f"the manifest lists {len(self.digests)} piece checksums for {self.count} "
                f"pieces of {self.piece_size} bytes",
                url=self.url,
            )

    def piece_of(self, pos: int) -> int:
        """The piece byte ``pos`` is in."""
        return pos // self.piece_size if self.piece_size else 0

    def span(self, k: int) -> tuple[int, int]:
        """The bytes ``[start, end)`` of piece ``k``."""
        if not self.piece_size:
            return 0, self.size
        return k * self.piece_size, min((k + 1) * self.piece_size, self.size)

    def expected(self, k: int) -> tuple[str, str]:
        """``(algorithm, hex digest)`` piece ``k`` must hash to."""
        if self.digests is None:
            return self.algo, self.digest
        return PIECE_ALGORITHM, self.digests[k]

    def hasher(self, k: int) -> Hasher:
        """A fresh hasher for piece ``k`` (its time counts in :data:`VERIFY_TIME`)."""
        return timed_hasher(self.expected(k)[0])

    def piece_ok(self, k: int, data: bytes | bytearray | memoryview) -> bool:
        """Whether ``data`` is exactly piece ``k``."""
        lo, hi = self.span(k)
        if len(data) != hi - lo:
            return False
        h = self.hasher(k)
        h.update(data)
        return h.hexdigest() == self.expected(k)[1]

    def piece_error(self, k: int, actual: str, why: str = "twice") -> ChecksumError:
        """The error for piece ``k`` that hashed to ``actual`` (or ``"N of M bytes"``)."""
        lo, hi = self.span(k)
        algo, want = self.expected(k)
        return ChecksumError(
            f"piece {k} (bytes {lo}..{hi}) differs from the manifest {why}; not read",
            url=self.url,
            expected=f"{algo}:{want}",
            actual=f"{algo}:{actual}" if " " not in actual else actual,
        )

    def whole_ok(self, hexdigest: str) -> bool:
        """Whether the whole shard's digest (by :attr:`algo`) is its checksum."""
        return hexdigest == self.digest

    def whole_error(self, actual: str | None) -> ChecksumError:
        """Every piece matched but the whole did not: the pieces are not this shard's."""
        return ChecksumError(
            "every piece matches the manifest's piece checksums but the whole shard does "
            "not match its checksum: the pieces listed are not this shard's",
            url=self.url,
            expected=self.checksum,
            actual=None if actual is None else f"{self.algo}:{actual}",
        )


class _Pieces(io.RawIOBase):
    """``[start, end)`` handed out a verified piece at a time (``_load`` gets one)."""

    def __init__(self, check: PieceCheck, start: int, end: int | None) -> None:
        self.check = check
        self._pos = start
        self._end = check.size if end is None else min(end, check.size)
        self._data = memoryview(b"")  # verified bytes of the current piece, from _pos on
        whole = start == 0 and self._end == check.size and check.digests is not None
        self._whole = new_hasher(check.algo) if whole else None

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._pos >= self._end:
            return 0
        if not self._data:
            k = self.check.piece_of(self._pos)
            data = self._load(k)
            if self._whole is not None:
                self._whole.update(data)
                if self.check.span(k)[1] == self.check.size:
                    got = self._whole.hexdigest()
                    if not self.check.whole_ok(got):
                        raise self.check.whole_error(got)
            self._data = memoryview(data)[self._pos - self.check.span(k)[0] :]
        n = min(len(b), len(self._data), self._end - self._pos)
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        self._pos += n
        return n

    def _load(self, k: int) -> bytes | bytearray:
        """Piece ``k``'s bytes, verified."""
        raise NotImplementedError


class VerifiedFile(_Pieces):
    """``[start, end)`` of a seekable binary file holding ``ref``'s bytes, each piece
    verified before any byte of it is handed out (see the module docstring).

    Args:
        f: the file (closed with the stream unless ``closefd`` is False).
        ref: what its bytes must be.
        on_bad: called with the reader's position and the error when a piece does not
            match; returns a stream of the rest of the range (``[pos, end)``) to go on
            with (a cache fetches a fresh copy), or None to raise the error.
    """

    def __init__(
        self,
        f: BinaryIO,
        ref: ObjectRef | PieceCheck,
        *,
        start: int = 0,
        end: int | None = None,
        closefd: bool = True,
        on_bad: Callable[[int, ChecksumError], BinaryIO | None] | None = None,
    ) -> None:
        super().__init__(ref if isinstance(ref, PieceCheck) else PieceCheck(ref), start, end)
        self._f = f
        self._closefd = closefd
        self._on_bad = on_bad
        self._rest: BinaryIO | None = None

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._rest is not None:
            n = int(self._rest.readinto(memoryview(b)[: self._end - self._pos]))  # type: ignore[attr-defined]
            self._pos += n
            return n
        try:
            return super().readinto(b)
        except _Swap:
            return self.readinto(b)

    def _load(self, k: int) -> bytes:
        lo, hi = self.check.span(k)
        self._f.seek(lo)
        data = self._f.read(hi - lo)
        if self.check.piece_ok(k, data):
            return data
        h = self.check.hasher(k)
        h.update(data)
        actual = h.hexdigest() if len(data) == hi - lo else f"{len(data)} of {hi - lo} bytes"
        error = self.check.piece_error(k, actual, why="on disk")
        rest = self._on_bad(self._pos, error) if self._on_bad is not None else None
        if rest is None:
            raise error
        self._drop_file()
        self._rest = rest
        raise _Swap

    def _drop_file(self) -> None:
        f, self._closefd = self._f, False
        if f is not None:
            f.close()

    def close(self) -> None:
        if not self.closed:
            if self._closefd:
                self._f.close()
            if self._rest is not None:
                self._rest.close()
        super().close()


class _Swap(Exception):
    """A bad piece was replaced by a fresh stream of the rest: read from it."""


class PieceStream(_Pieces):
    """``[start, end)`` of the remote shard ``ref`` verified piece by piece.

    ``fetch(lo, hi)`` streams the remote bytes ``[lo, hi)``; a piece that does not match
    is fetched once more (a request of its own) before :class:`ChecksumError`.
    """

    def __init__(
        self,
        fetch: Fetch,
        ref: ObjectRef,
        *,
        start: int,
        end: int,
        counters: Counters | None = None,
    ) -> None:
        super().__init__(PieceCheck(ref), start, end)
        self._fetch = fetch
        self._counters = counters
        self._chunks: Iterator[bytes] | None = None
        self._at = 0  # where the stream of chunks stands
        self._left = memoryview(b"")  # bytes of its last chunk not taken yet

    def _load(self, k: int) -> bytearray:
        lo, hi = self.check.span(k)
        actual = ""
        for attempt in (1, 2):
            data = self._read_piece(lo, hi, fresh=attempt > 1)
            if self.check.piece_ok(k, data):
                if self._counters is not None:
                    self._counters.add("pieces_verified")
                return data
            h = self.check.hasher(k)
            h.update(data)
            actual = h.hexdigest() if len(data) == hi - lo else f"{len(data)} of {hi - lo} bytes"
            if self._counters is not None:
                self._counters.add("checksum_failures")
            log.warning(
                "%s: piece %d (bytes %d..%d) differs from the manifest, attempt %d of 2",
                self.check.url,
                k,
                lo,
                hi,
                attempt,
            )
        raise self.check.piece_error(k, actual)

    def _read_piece(self, lo: int, hi: int, *, fresh: bool) -> bytearray:
        """The bytes ``[lo, hi)`` (fewer if the answer ends early): from the running
        request (one covers every piece of the range), or for a second attempt from a
        request of their own (the running one goes on with the next piece)."""
        if fresh:
            chunks = self._fetch(lo, hi)
            try:
                return bytearray().join(chunks)[: hi - lo]
            finally:
                _close(chunks)
        if self._chunks is None or self._at != lo:
            self._close_chunks()
            last = self.check.span(self.check.piece_of(self._end - 1))[1]
            self._chunks = self._fetch(lo, last)
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
        _close(chunks)

    def close(self) -> None:
        if not self.closed:
            self._close_chunks()
        super().close()


def _close(chunks: object) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()
