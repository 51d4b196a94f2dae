"""Hashing what passes, the one home: a :class:`Digest` (the whole-object checksum, the
per-piece checksums, the byte count, a progress callback) fed by a :class:`HashingReader`
or a :class:`HashingWriter`. The writer hashes a shard as it writes it, verify and
from-shards as they read it, the io layer as a download streams through (no second pass)."""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from shardkit.format.checksum import Hasher, new_hasher
from shardkit.format.pieces import PieceHasher

__all__ = ["Digest", "HashingReader", "HashingWriter"]

Buffer = bytes | bytearray | memoryview
# bytes hashed, then written, at a time by write_parts: small enough that what was hashed is
# still in the CPU's cache when the kernel copies it out, large enough for few syscalls
_GROUP = 512 << 10
_IOV_MAX = 1024  # POSIX's least IOV_MAX; Linux's


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
        self._write_out(memoryview(data).cast("B"))
        return len(data)

    def write_parts(self, parts: Sequence[Buffer]) -> None:
        """Hash and write ``parts`` in order, without joining them: about 512 KiB at a time,
        each group hashed and then written (one ``writev`` where the file has a descriptor)
        while it is still in the CPU's cache."""
        fd = _descriptor(self.f)
        group: list[memoryview] = []
        size = 0
        for part in parts:
            view = memoryview(part).cast("B")
            if not view:
                continue
            self.digest.update(view)
            group.append(view)
            size += len(view)
            if size >= _GROUP:
                self._write_group(fd, group)
                group, size = [], 0
        if group:
            self._write_group(fd, group)

    def _write_group(self, fd: int | None, group: list[memoryview]) -> None:
        if fd is None:
            for view in group:
                self._write_out(view)
            return
        at = 0  # the first view not yet written whole
        while at < len(group):
            n = os.writev(fd, group[at : at + _IOV_MAX])
            if not n:
                raise OSError(errno.EIO, "the file took no bytes")
            while n:  # step over what was written; a short write goes on mid-view
                k = len(group[at])
                if n < k:
                    group[at] = group[at][n:]
                    break
                n -= k
                at += 1

    def _write_out(self, view: memoryview) -> None:
        while view:
            n = self.f.write(view)
            if not n:
                raise OSError(errno.EIO, "the file took no bytes")
            view = view[n:]

    def flush(self) -> None:
        self.f.flush()


def _descriptor(f: Any) -> int | None:
    """The descriptor of an unbuffered local file (whose ``write`` is one syscall), else
    None: a buffered file or an upload takes its bytes through ``write``."""
    if not isinstance(f, io.FileIO):
        return None
    return f.fileno()
