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

import gzip
import io
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from shardkit.codecs import zstd_reader
from shardkit.errors import ShardFormatError

__all__ = ["COMPRESSED_SUFFIXES", "compressed_name", "open_tar", "sniff"]

COMPRESSED_SUFFIXES = (".zst", ".gz", ".tgz")
_MAGIC = (
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"\x1f\x9d", "compress (.Z)"),
)
_HEAD = 6  # bytes enough to tell every magic above


def sniff(head: bytes) -> str | None:
    """The compression whose magic ``head`` starts with, or None (a plain tar, or not)."""
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
    """A gzip decompressing stream whose corrupt or cut input is a ShardFormatError."""

    def __init__(self, f: BinaryIO) -> None:
        self._gz = gzip.GzipFile(fileobj=f, mode="rb")

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._gz.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            raise ShardFormatError(f"corrupt gzip data: {exc}") from exc

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._gz.close()
        finally:
            super().close()


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
