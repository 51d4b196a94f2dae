"""Local files and ``file://`` urls, verified before a byte is handed out.

A local (or shared-filesystem) shard whose manifest gives its ``size`` and ``checksum`` is
read through a :class:`SeekableVerified`: each piece is read whole into a reused buffer and
checked (by :class:`~shardkit.io.verified.PieceCheck`, the one verifier) before any byte of
it is handed out, as the node cache and :class:`~shardkit.io.verified.PieceStream` do for
remote shards. Unlike :class:`~shardkit.io.verified.VerifiedFile` it seeks, reuses its
piece buffers and hashes a piece as it reads it, which the tar reader's unbuffered read of
large members and the cost of verification need. A piece that does not
match is a :class:`ChecksumError` naming the shard and the piece; a file of another size
than the manifest's is one at open. The whole-shard checksum is not hashed again on a read
that has manifest pieces (they are the manifest's promise; ``shardkit verify`` checks the
whole): xxh3-128 runs at memory speed, sha256 would cost more than the read.

Where the manifest lists no pieces, the first open of a shard in a process reads the file
once whole, checks it against the manifest's ``checksum`` and computes xxh3-128 digests of
16 MiB pieces as it goes (:func:`computed_pieces`); every read of it, that one included,
is then verified piece by piece against them. So a byte changed on disk after that check
is still caught before it is handed out. The computed digests are kept per process, keyed
by the file's identity (device, inode, size, mtime, ctime) and the checksum: a file
rewritten or replaced is hashed whole again.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, BinaryIO, cast

import numpy as np

from shardkit._types import ObjectRef, PieceChecksums
from shardkit.durable import open_regular
from shardkit.errors import ChecksumError, FetchError
from shardkit.format.checksum import split_checksum
from shardkit.format.digest import Digest
from shardkit.format.pieces import DEFAULT_PIECE_SIZE, Pieces
from shardkit.io.verified import PieceCheck
from shardkit.urls import local_path

__all__ = ["SeekableVerified", "computed_pieces", "open_local"]

_READ = 8 << 20  # bytes per read of a whole-shard check
_HASH_READ = 1 << 20  # bytes per read of a piece (hashed while in the CPU cache)
_MEMO_SIZE = 4096  # files whose computed pieces a process keeps (~1 KB each per GB)
# piece buffers of closed streams, kept for the next (a fresh 16 MiB buffer costs its
# zeroing and a page fault per 4 KiB, which measured more than the hashing)
_SPARE_BUFFERS = 4
_spare: list[np.ndarray[Any, Any]] = []
# reentrant, as every lock a close() takes: the garbage collector may close an abandoned
# stream (an iterator dropped mid-shard) in the thread that holds it, while it allocates
_spare_lock = threading.RLock()
_memo: OrderedDict[tuple[object, ...], Pieces] = OrderedDict()
_memo_lock = threading.RLock()


def _within(offset: int, whence: int, pos: int, start: int, end: int) -> int:
    """The position a ``seek`` asks for in a window ``[start, end]`` of a file; outside it
    is an ``OSError``."""
    base = {io.SEEK_SET: 0, io.SEEK_CUR: pos, io.SEEK_END: end}[whence]
    target = base + offset
    if not start <= target <= end:
        raise OSError(f"seek to {target} is outside the range {start}..{end}")
    return target


_BIG = 64 << 20  # a read this large is first cut to what the file holds


class _Bounded(io.RawIOBase):
    """``[start, end)`` of an open file: reads stop at ``end``; it seeks within the range
    (positions are offsets in the file), so the tar reader reads large members unbuffered."""

    def __init__(self, f: io.FileIO, start: int, end: int) -> None:
        self._f = f
        self._start = start
        self._end = end
        self._pos = start

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._f.fileno()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._f.seek(_within(offset, whence, self._pos, self._start, self._end))
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = self._end - self._pos
        n = left if size is None or size < 0 else min(size, left)
        if n > _BIG:  # read(n) allocates n bytes first: a range past the end asks no more
            n = min(n, os.fstat(self._f.fileno()).st_size - self._pos)
        if n <= 0:
            return b""
        data = self._f.read(n) or b""
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b).cast("B")[: max(0, self._end - self._pos)]
        n = self._f.readinto(view) if len(view) else 0
        self._pos += n or 0
        return n or 0

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            super().close()


class SeekableVerified(io.RawIOBase):
    """``[start, end)`` of the local file ``fd`` (``size`` bytes), each piece checked against
    its digest before a byte of it is handed out.

    A piece is read whole into one buffer that is reused for every piece (one piece of
    memory: a second one for the piece before it, for the rare step back over a piece's
    start, cost ~10% of a verified read of 150 KB samples in memory traffic; such a step
    reads and checks that piece again), hashed, and only then read from. ``read(n)`` hands
    out one copy of verified bytes; the stream seeks (positions are offsets in the file),
    so the tar reader reads large members straight into their own objects. A piece that
    does not match its digest is a :class:`ChecksumError` naming the shard and the piece,
    raised before any of it is read.
    The file descriptor is closed with the stream.
    """

    def __init__(self, fd: int, check: PieceCheck, *, start: int, end: int) -> None:
        self._fd = fd
        self._check = check
        self._start = start
        self._end = min(end, check.size)
        self._pos = start
        # (piece number, its start, its end, its verified bytes)
        self._cur: tuple[int, int, int, memoryview] = (-1, 0, 0, memoryview(b""))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = _within(offset, whence, self._pos, self._start, self._end)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        src = self._verified()
        n = min(len(b), len(src))
        memoryview(b).cast("B")[:n] = src[:n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        left = self._end - self._pos
        n = left if size is None or size < 0 else min(size, left)
        if n <= 0:
            return b""
        src = self._verified()
        if len(src) >= n:
            self._pos += n
            return bytes(src[:n])
        parts = []
        while n > 0:
            src = self._verified()
            take = min(n, len(src))
            parts.append(bytes(src[:take]))  # the buffer is reused by the next piece
            self._pos += take
            n -= take
        return b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def _verified(self) -> memoryview:
        """The verified bytes from the current position to the end of its piece (or of
        the range); empty at the end of the range."""
        pos = self._pos
        if pos >= self._end:
            return memoryview(b"")
        _, lo, hi, data = self._cur
        if not lo <= pos < hi:
            self._cur = self._load(self._check.piece_of(pos))
            _, lo, hi, data = self._cur
        return data[pos - lo : min(hi, self._end) - lo]

    def _load(self, k: int) -> tuple[int, int, int, memoryview]:
        """Read piece ``k`` whole (into the buffer of the piece read before) and check it;
        it is hashed a read at a time, while each read is still in the CPU cache."""
        lo, hi = self._check.span(k)
        old = self._cur[3]
        self._cur = (-1, 0, 0, memoryview(b""))  # nothing verified while it is overwritten
        # the largest piece of this shard (a piece size past the shard's is a buffer of the shard)
        most = min(self._check.piece_size, self._check.size) or hi - lo
        buf: Any = old.obj if len(old) >= hi - lo else _buffer(most)
        if buf is not old.obj and isinstance(old.obj, np.ndarray):
            _give_back(old.obj)
        view = memoryview(buf)[: hi - lo]
        hasher = self._check.hasher(k)
        got = 0
        while got < hi - lo:
            n = os.preadv(self._fd, [view[got : got + _HASH_READ]], lo + got)
            if not n:
                break
            hasher.update(view[got : got + n])
            got += n
        actual = hasher.hexdigest()
        if got != hi - lo or actual != self._check.expected(k)[1]:
            short = f"{got} of {hi - lo} bytes"
            raise self._check.piece_error(k, actual if got == hi - lo else short, why="on disk")
        return k, lo, hi, view.toreadonly()

    def close(self) -> None:
        if not self.closed:
            data = self._cur[3]
            if isinstance(data.obj, np.ndarray):
                _give_back(data.obj)
            self._cur = (-1, 0, 0, memoryview(b""))
            fd, self._fd = self._fd, -1
            if fd >= 0:
                os.close(fd)
        super().close()


def _buffer(n: int) -> np.ndarray[Any, Any]:
    """A buffer of at least ``n`` bytes: a spare one if one is large enough."""
    with _spare_lock:
        for i, buf in enumerate(_spare):
            if len(buf) >= n:
                return _spare.pop(i)
    # numpy asks the kernel for huge pages for a buffer this big (madvise): a fresh 16 MiB
    # piece buffer then costs 8 page faults, not 4,096 (a bytearray measured 10-40 ms here,
    # most of a first batch's time)
    return np.empty(n, dtype=np.uint8)


def _give_back(buf: np.ndarray[Any, Any]) -> None:
    with _spare_lock:
        if len(_spare) < _SPARE_BUFFERS:
            _spare.append(buf)


def _open_file(url: str, path: str) -> int:
    """A descriptor of the regular file at ``path`` (:func:`open_regular`); anything else,
    or a failed open, is a :class:`FetchError`."""
    try:
        return open_regular(path)
    except OSError as exc:
        raise FetchError(f"cannot open: {exc.strerror}", url=url) from exc


def open_local(ref: ObjectRef, start: int = 0, end: int | None = None) -> BinaryIO:
    """Open ``[start, end)`` of a local file (``ref.url``: a path or ``file://`` url) as a
    binary stream.

    With ``ref``'s size and checksum every byte is verified before it is handed out (see
    the module docstring), piece by piece against its pieces when it has them.
    """
    url = ref.url
    path = local_path(url)
    if ref.size is not None and ref.checksum is not None:
        return _open_verified(url, path, start, end, ref.size, ref.checksum, ref.pieces)
    f = open(_open_file(url, path), "rb", buffering=0)  # noqa: SIM115 - returned to the caller
    if start:
        f.seek(start)
    if end is None:
        return f
    return cast(BinaryIO, _Bounded(f, start, end))


def _open_verified(
    url: str,
    path: str,
    start: int,
    end: int | None,
    size: int,
    checksum: str,
    pieces: PieceChecksums | None,
) -> BinaryIO:
    fd = _open_file(url, path)
    try:
        have = os.fstat(fd).st_size
        if have != size:
            raise ChecksumError(
                "size differs from the manifest",
                url=url,
                expected=f"{size} bytes",
                actual=f"{have} bytes",
            )
        if pieces is None:
            pieces = computed_pieces(fd, url, size, checksum)
        stop = size if end is None else min(end, size)
        check = PieceCheck(ObjectRef(url, size, checksum, pieces))
        raw = SeekableVerified(fd, check, start=start, end=stop)
    except BaseException:
        os.close(fd)
        raise
    return cast(BinaryIO, raw)


def computed_pieces(fd: int, url: str, size: int, checksum: str) -> Pieces:
    """Piece digests of the open file ``fd`` once its whole content matched ``checksum``
    (kept per process for the same file, unchanged, and checksum); else
    :class:`ChecksumError` naming ``url``."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns, checksum)
    with _memo_lock:
        got = _memo.get(key)
        if got is not None:
            _memo.move_to_end(key)
            return got
    algo, want = split_checksum(checksum)
    digest = Digest(algo, DEFAULT_PIECE_SIZE)
    for chunk in _pread_chunks(fd, 0, size):
        digest.update(chunk)
    actual = digest.hasher.hexdigest()
    if digest.size != size or actual != want:
        raise ChecksumError(
            "checksum differs from the manifest",
            url=url,
            expected=checksum,
            actual=f"{algo}:{actual}" if digest.size == size else f"{digest.size} bytes",
        )
    assert digest.pieces is not None
    pieces = digest.pieces.result()
    with _memo_lock:
        _memo[key] = pieces
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    return pieces


def _pread_chunks(fd: int, lo: int, hi: int) -> Iterator[bytes]:
    """The bytes ``[lo, hi)`` of ``fd`` in reads of up to 8 MiB (fewer at its end)."""
    pos = lo
    while pos < hi:
        data = os.pread(fd, min(_READ, hi - pos), pos)
        if not data:
            return
        pos += len(data)
        yield data
