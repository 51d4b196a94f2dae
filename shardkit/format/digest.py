"""Hashing what passes, the one home: a :class:`Digest` (the whole-object checksum, the
per-piece checksums, the byte count, a progress callback) fed by a :class:`HashingReader`
or a :class:`HashingWriter`. The writer hashes a shard as it writes it, verify and
from-shards as they read it, the io layer as a download streams through (no second pass)."""

from __future__ import annotations

import errno
import io
from collections.abc import Callable
from typing import Any, BinaryIO

from shardkit.format.checksum import Hasher, new_hasher
from shardkit.format.pieces import PieceHasher

__all__ = ["Digest", "HashingReader", "HashingWriter"]


class Digest:
    """Everything that passes: ``hasher`` (whole object), ``pieces`` (per piece, when a
    piece size is given), ``size`` in bytes; ``progress`` is told each byte count.

    Args:
        algo: a checksum algorithm name, or a hasher already made.
        piece_size: bytes per piece (None: no piece checksums).
        progress: called with the byte count of every update.
    """

    def __init__(
        self,
        algo: str | Hasher,
        piece_size: int | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> None:
        self.algo = algo if isinstance(algo, str) else None
        self.hasher = new_hasher(algo) if isinstance(algo, str) else algo
        self.pieces = PieceHasher(piece_size) if piece_size else None
        self.progress = progress
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if not n:
            return
        self.hasher.update(data)
        if self.pieces is not None:
            self.pieces.update(data)
        self.size += n
        if self.progress is not None:
            self.progress(n)

    def checksum(self) -> str:
        """``algo:hex`` of what passed (needs the algorithm's name)."""
        return f"{self.algo}:{self.hasher.hexdigest()}"


class HashingReader(io.RawIOBase):
    """A read-only stream over ``f`` that feeds ``digest`` every byte read through it."""

    def __init__(self, f: BinaryIO, digest: Digest) -> None:
        self._f = f
        self.digest = digest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        readinto = getattr(self._f, "readinto", None)
        if readinto is None:
            data = self._f.read(len(b))
            n = len(data)
            b[:n] = data
        else:
            n = int(readinto(b) or 0)
        self.digest.update(memoryview(b)[:n])
        return n

    def drain(self, buf: bytearray | None = None) -> None:
        """Read (and hash) everything left, e.g. what a tar parser left: end-of-archive."""
        buf = buf if buf is not None else bytearray(1 << 20)
        while self.readinto(buf):
            pass


class HashingWriter:
    """A write-only file over ``f`` that feeds ``digest`` what is written; a short write
    (a disk filling up) is continued, and a write that takes nothing is an ``OSError``."""

    def __init__(self, f: BinaryIO, digest: Digest) -> None:
        self.f = f
        self.digest = digest

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.digest.update(data)
        view = memoryview(data).cast("B")
        while view:
            n = self.f.write(view)
            if not n:
                raise OSError(errno.EIO, "the file took no bytes")
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        self.f.flush()
