"""zstd streams: a reader that checks a stream to the end of every frame (a cut or corrupt
one is a :class:`~shardkit.errors.ShardFormatError`), and a writer."""

from __future__ import annotations

import io
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

from shardkit.errors import ShardFormatError

__all__ = ["zstd_reader", "zstd_writer"]


_ZSTD_FRAME = 0xFD2FB528
_FRAME, _SKIP_SIZE, _DESCRIPTOR, _BLOCK = range(4)  # what the next bytes of a zstd stream are


class _ZstdFrames:
    """The compressed source under a zstd decompressor, followed frame by frame.

    python-zstandard's stream reader takes input that ends inside a frame as a clean end,
    so a stream cut before its content checksum (the frame's last 4 bytes) read as whole.
    Only headers are looked at (a frame's header, each block's 3-byte header, a skippable
    frame's size); an end of the input anywhere but between frames is a
    :class:`ShardFormatError`.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._state = _FRAME
        self._head = b""  # the bytes of the header being read
        self._want = 4  # its length
        self._skip = 0  # bytes to pass before the next header (block data, a checksum)
        self._checksum = False  # the current frame ends with a content checksum
        self._pos = 0  # compressed bytes read

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if data:
            self._scan(data)
        elif self._state != _FRAME or self._head or self._skip:
            raise ShardFormatError(
                f"truncated zstd data: the stream ends inside a frame at compressed byte "
                f"{self._pos} (its end and content checksum never came)"
            )
        return data

    def close(self) -> None:
        """Close the source (the reader above closes its source when it is closed)."""
        self._f.close()

    def _scan(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                k = min(self._skip, n - i)
                self._skip -= k
                i += k
                continue
            k = min(self._want - len(self._head), n - i)
            self._head += data[i : i + k]
            i += k
            if len(self._head) == self._want:
                value = int.from_bytes(self._head, "little")
                self._head = b""
                self._step(value, self._pos + i)
        self._pos += n

    def _step(self, value: int, at: int) -> None:
        """A whole header ``value`` read, ending at compressed byte ``at``."""
        state, self._want = self._state, 3
        if state == _FRAME:
            if value == _ZSTD_FRAME:
                self._state, self._want = _DESCRIPTOR, 1
            elif value & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame
                self._state, self._want = _SKIP_SIZE, 4
            else:
                raise ShardFormatError(f"corrupt zstd data: no frame at compressed byte {at - 4}")
        elif state == _SKIP_SIZE:
            self._state, self._want, self._skip = _FRAME, 4, value
        elif state == _DESCRIPTOR:  # the window, dictionary id and content size follow
            single = value >> 5 & 1
            self._checksum = bool(value >> 2 & 1)
            fcs = (single, 2, 4, 8)[value >> 6]
            self._skip = (1 - single) + (0, 1, 2, 4)[value & 3] + fcs
            self._state = _BLOCK
        else:  # a block header: last-block bit, type (raw, RLE, compressed), size
            kind, size = value >> 1 & 3, value >> 3
            self._skip = 1 if kind == 1 else size
            if value & 1:
                self._skip += 4 if self._checksum else 0
                self._state, self._want = _FRAME, 4


class _ZstdStream(io.RawIOBase):
    """A zstd decompressing stream whose corrupt or cut input is a :class:`ShardFormatError`.

    Read to its end, it has checked every frame's content checksum and that the stream
    ends where a frame does (``checked_at_end``: the tar reader reads it on to its end).
    """

    checked_at_end = True

    def __init__(self, f: BinaryIO) -> None:
        import zstandard

        self._error = zstandard.ZstdError
        frames: Any = _ZstdFrames(f)  # read() is all the reader asks of its source
        self._reader: Any = zstandard.ZstdDecompressor().stream_reader(
            frames, read_size=1 << 20, read_across_frames=True
        )

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            return int(self._reader.readinto(b))
        except self._error as exc:
            raise ShardFormatError(f"corrupt zstd data: {exc}") from exc

    def read(self, size: int = -1) -> bytes:
        try:
            return bytes(self._reader.read(size))
        except self._error as exc:
            raise ShardFormatError(f"corrupt zstd data: {exc}") from exc

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            super().close()


def zstd_reader(f: BinaryIO) -> AbstractContextManager[BinaryIO]:
    """A streaming zstd decompressor over ``f``; corrupt data raises ShardFormatError."""
    stream: AbstractContextManager[BinaryIO] = _ZstdStream(f)  # type: ignore[assignment]
    return stream


def zstd_writer(f: BinaryIO, level: int = 3) -> Any:
    """A streaming zstd compressor writing into ``f`` (close it to flush)."""
    import zstandard

    # the frame checksum lets a reader notice corrupt data without the manifest
    return zstandard.ZstdCompressor(level=level, threads=0, write_checksum=True).stream_writer(
        f, closefd=False
    )
