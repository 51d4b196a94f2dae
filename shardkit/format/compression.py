"""Whole-shard compression, recognised by its magic bytes.

A shard may be a plain tar, or a tar compressed whole with zstd (``.tar.zst``) or gzip
(``.tar.gz``/``.tgz``). What a shard *is* comes from its first bytes, not its name: a
``.tar`` that is really gzip is read as gzip, and a shard compressed with something shardkit
does not read (bzip2, xz, lz4, compress) is named as such in a :class:`ShardFormatError`.
Names still matter where nothing has been read yet: a ranged read of part of a shard
(sample *i* by its index) is only possible in a plain tar, so a compressed name means
"read from the start" (offsets in a compressed shard's index are offsets in the
decompressed tar; resuming in the middle of one decompresses everything before).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from shardkit.errors import ShardFormatError
from shardkit.format.zstd import zstd_reader

__all__ = ["COMPRESSED_SUFFIXES", "SHARD_SUFFIXES", "compressed_name", "open_tar", "sniff"]

COMPRESSED_SUFFIXES = (".zst", ".gz", ".tgz")
# the names a shard file may end with (its content is still told by magic bytes)
SHARD_SUFFIXES = (".tar", ".tar.zst", ".tar.gz", ".tgz")
_MAGIC = (
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"\x1f\x9d", "compress (.Z)"),
)
_SKIPPABLE = b"\x2a\x4d\x18"  # bytes 1-3 of a zstd skippable frame's magic, little-endian
_HEAD = 6  # bytes enough to tell every magic above
_IN = 1 << 20  # compressed bytes read at a time


def sniff(head: bytes) -> str | None:
    """The compression whose magic ``head`` starts with, or None (a plain tar, or not).

    A zstd stream may start with a skippable frame (magic 0x184D2A50-5F): pzstd writes
    one before each frame, holding the frame's size.
    """
    if head[1:4] == _SKIPPABLE and 0x50 <= head[0] <= 0x5F:
        return "zstd"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def compressed_name(url: str) -> bool:
    """Whether a shard's name says it is compressed whole (so it must be read from byte 0)."""
    path = url.split("?", 1)[0].lower()
    return path.endswith(COMPRESSED_SUFFIXES)


class _Replay(io.RawIOBase):
    """The bytes already read from a stream that cannot seek back, then the rest of it."""

    def __init__(self, head: bytes, f: BinaryIO) -> None:
        self._head = head
        self._f = f

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size < 0:
                head, self._head = self._head, b""
                return head + self._f.read()
            head, self._head = self._head[:size], self._head[size:]
            return head
        return self._f.read(size)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _GzipStream(io.RawIOBase):
    """A gzip decompressing stream (every member of a multi-member file) whose corrupt or
    cut input is a ShardFormatError; errors of the stream below pass through as they are.

    zlib is driven directly with 1 MiB reads: Python's gzip module decompresses 8 KiB of
    input per call, and that loop, not zlib, was the cost of reading a .tar.gz shard.
    Read to its end, it has checked every member's CRC-32 and length (``checked_at_end``:
    the tar reader reads it on to its end).
    """

    checked_at_end = True

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._d = zlib.decompressobj(31)  # 16 + 15: a gzip wrapper, its CRC checked
        self._pending = b""  # compressed bytes read but not yet given to zlib
        self._started = False  # a member has begun (its end must come)
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            parts = []
            while chunk := self.read(_IN):
                parts.append(chunk)
            return b"".join(parts)
        while not self._done and size:
            if not self._pending:
                self._pending = self._f.read(_IN)
                if not self._pending:
                    if self._started:
                        raise ShardFormatError("truncated gzip data: the stream ends mid-member")
                    self._done = True
                    break
            if not self._started:
                self._pending = self._pending.lstrip(b"\0")  # padding between members
                if not self._pending:
                    continue
            try:
                out = self._d.decompress(self._pending, size)
            except zlib.error as exc:
                raise ShardFormatError(f"corrupt gzip data: {exc}") from exc
            self._started = True
            self._pending = self._d.unconsumed_tail
            if self._d.eof:
                self._next_member(self._d.unused_data + self._pending)
            if out:
                return out
        return b""

    def _next_member(self, rest: bytes) -> None:
        """After a member's end: another member, zero padding, or garbage (an error)."""
        self._started = False
        self._d = zlib.decompressobj(31)
        stripped = rest.lstrip(b"\0")
        if stripped and not stripped.startswith(b"\x1f\x8b"):
            raise ShardFormatError("corrupt gzip data: bytes after the end that are not gzip")
        self._pending = stripped

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _head(f: BinaryIO) -> tuple[bytes, BinaryIO]:
    """The first bytes of ``f`` and a stream that still starts at them."""
    seekable = getattr(f, "seekable", None)
    if seekable is not None and seekable():
        pos = f.tell()
        head = f.read(_HEAD)
        f.seek(pos)
        return head, f
    head = b""
    while len(head) < _HEAD:
        more = f.read(_HEAD - len(head))
        if not more:
            break
        head += more
    stream: BinaryIO = _Replay(head, f)  # type: ignore[assignment]
    return head, stream


@contextmanager
def open_tar(f: BinaryIO, *, url: str) -> Iterator[tuple[BinaryIO, str | None]]:
    """``(tar stream, compression)`` for a shard stream positioned at its first byte.

    The compression is None for a plain tar, whose stream is ``f`` itself when ``f`` can
    seek (so its size and seeks still work). A compression shardkit cannot read raises
    :class:`ShardFormatError` at byte 0.
    """
    head, src = _head(f)
    kind = sniff(head)
    if kind is None:
        yield src, None
    elif kind == "zstd":
        with zstd_reader(src) as z:
            yield z, kind
    elif kind == "gzip":
        with _GzipStream(src) as g:
            yield g, kind  # type: ignore[misc]
    else:
        raise ShardFormatError(
            f"the shard is compressed with {kind}, which shardkit does not read: "
            "decompress it, or recompress it with zstd or gzip",
            url=url,
            offset=0,
        )
