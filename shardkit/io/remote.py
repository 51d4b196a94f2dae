"""The uncached opener: every scheme, streamed straight from where it lives.

``RemoteOpener`` dispatches on the url's scheme (local path / ``file://``, ``http(s)://``,
``s3://``, ``pipe:``). A whole-object read given the manifest's ``size`` and ``checksum``
is verified on the fly: the last read raises :class:`ChecksumError` on a mismatch, so even
without a cache a corrupt shard is never taken for a good one. A shard with piece checksums
(and every local shard with a checksum, :mod:`shardkit.io.local`) is verified piece by piece
before any byte is handed out; remote ranged reads without pieces are not verified here;
:meth:`RemoteOpener.open_pieces` (what the node cache reads a shard it cannot hold with)
verifies any read piece by piece (:mod:`shardkit.io.verified`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, Protocol

from shardkit._types import Hint, ObjectRef, PieceChecksums
from shardkit.counters import Counters
from shardkit.errors import ChecksumError, ConfigError
from shardkit.format.checksum import split_checksum
from shardkit.format.digest import Digest
from shardkit.io.blobs import AzSource, BlobSource, GsSource
from shardkit.io.config import IoConfig
from shardkit.io.http import HttpSource
from shardkit.io.hub import HubSource
from shardkit.io.local import open_local
from shardkit.io.pipe import check_pipe_allowed, open_pipe
from shardkit.io.retry import Gate
from shardkit.io.s3 import S3Source
from shardkit.io.verified import PieceStream
from shardkit.urls import HTTP_SCHEMES, url_scheme

__all__ = ["ChunkStream", "RangeSource", "RemoteOpener"]


class RangeSource(Protocol):
    """Something that streams ``[start, end)`` of a remote object (HTTP, S3)."""

    def stream(
        self, url: str, start: int = 0, end: int | None = None, *, gate: Gate | None = None
    ) -> Iterator[bytes]: ...

    def get(self, url: str, *, etag: str | None = None) -> tuple[bytes | None, str | None]: ...

    def location(self, url: str) -> str:
        """Where ``url`` lives in full (scheme, endpoint or host, bucket, key)."""
        ...


class ChunkStream(io.RawIOBase):
    """A raw binary stream over an iterator of byte chunks.

    With ``size`` and ``checksum`` it hashes what passes and, at the end, raises
    :class:`ChecksumError` (naming ``url``) if the bytes are not the promised ones.
    """

    def __init__(
        self,
        chunks: Iterator[bytes],
        *,
        url: str,
        size: int | None = None,
        checksum: str | None = None,
    ) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")
        self._url = url
        self._size = size
        self._checksum = checksum
        self._digest = Digest(split_checksum(checksum)[0]) if checksum else None
        self._seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._verify()
                return 0
            self._buf = memoryview(chunk)
            self._seen += len(chunk)
            if self._digest is not None:
                self._digest.update(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _verify(self) -> None:
        if self._size is not None and self._seen != self._size:
            raise ChecksumError(
                "size differs from the manifest",
                url=self._url,
                expected=f"{self._size} bytes",
                actual=f"{self._seen} bytes",
            )
        if self._digest is not None and self._checksum is not None:
            algo, want = split_checksum(self._checksum)
            got = self._digest.hasher.hexdigest()
            if got != want:
                raise ChecksumError(
                    "checksum differs from the manifest",
                    url=self._url,
                    expected=self._checksum,
                    actual=f"{algo}:{got}",
                )
            self._digest = None

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        super().close()


def buffered(raw: io.RawIOBase) -> BinaryIO:
    """Wrap a raw stream in a 1 MiB buffer."""
    return io.BufferedReader(raw, buffer_size=1 << 20)


class RemoteOpener:
    """Reads any scheme without a cache (see the module docstring).

    Args:
        cfg: the io options.
        counters: this process's counters (shared with a caching opener above it).
    """

    def __init__(self, cfg: IoConfig, counters: Counters | None = None) -> None:
        self.cfg = cfg
        self.counters = counters or Counters()
        self.http = HttpSource(cfg, self.counters)
        self.hub = HubSource(cfg, self.counters)
        self._s3: S3Source | None = None
        self._blobs: dict[str, BlobSource] = {}

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def source(self, url: str) -> RangeSource | None:
        """The ranged source for a remote url, or None for local and pipe urls."""
        scheme = url_scheme(url)
        if scheme in HTTP_SCHEMES:
            return self.http
        if scheme == "s3":
            if self._s3 is None:
                self._s3 = S3Source(self.cfg, self.counters)
            return self._s3
        if scheme == "hf":
            return self.hub
        if scheme in ("gs", "az"):
            if scheme not in self._blobs:
                kind = GsSource if scheme == "gs" else AzSource
                self._blobs[scheme] = kind(self.cfg, self.counters)
            return self._blobs[scheme]
        if scheme in ("file", "pipe"):
            return None
        raise ConfigError(f"unsupported url scheme {scheme!r} in {url!r}")

    def location(self, url: str) -> str:
        """Where the remote ``url`` lives in full (see :meth:`RangeSource.location`)."""
        src = self.source(url)
        if src is None:
            raise ConfigError(f"{url!r} is not a remote url")
        return src.location(url)

    def open(
        self,
        url: str,
        *,
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        checksum: str | None = None,
        pieces: PieceChecksums | None = None,
    ) -> BinaryIO:
        """Stream ``[start, end)`` of ``url``, verified unless ``cfg.verify`` is off: a
        local file and a remote shard with ``pieces`` piece by piece before any byte is
        handed out; a remote whole-object read without pieces at its end."""
        if url_scheme(url) == "pipe":
            check_pipe_allowed(url, self.cfg.allow_pipe)
            return open_pipe(url, start=start, end=end)
        if self.cfg.verify == "off":
            checksum = pieces = None
        src = self.source(url)
        if src is None:
            return open_local(
                url, start=start, end=end, size=size, checksum=checksum, pieces=pieces
            )
        if pieces is not None and checksum is not None and size:
            stop = size if end is None else min(end, size)
            return self.open_pieces(
                url, start=start, end=stop, size=size, checksum=checksum, pieces=pieces
            )
        whole = start == 0 and (end is None or end == size)
        if end is None and size is not None:
            end = size
        self.counters.add("uncached_reads")
        return buffered(
            ChunkStream(
                src.stream(url, start, end),
                url=url,
                size=size if whole else None,
                checksum=checksum if whole else None,
            )
        )

    def open_pieces(
        self,
        ref: ObjectRef | str,
        *,
        start: int,
        end: int,
        size: int | None = None,
        checksum: str | None = None,
        pieces: PieceChecksums | None = None,
    ) -> BinaryIO:
        """Stream ``[start, end)`` of the remote shard ``ref`` (or its url, size,
        checksum and pieces), no byte of it before the piece it is in matches its
        checksum (see :mod:`shardkit.io.verified`)."""
        if not isinstance(ref, ObjectRef):
            ref = ObjectRef(ref, size, checksum, pieces)
        src = self.source(ref.url)
        if src is None:
            raise ConfigError(f"{ref.url!r} is not a remote url")
        self.counters.add("uncached_reads")
        stream = PieceStream(
            lambda lo, hi: src.stream(ref.url, lo, hi),
            ref,
            start=start,
            end=end,
            counters=self.counters,
        )
        return buffered(stream)

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        with self.open(url, start=start, end=end) as f:
            return f.read()

    def fetch_manifest(self, url: str) -> bytes:
        """The whole (small) object at ``url``: a manifest."""
        src = self.source(url)
        if src is None:
            return self.read(url)
        data, _ = src.get(url)
        assert data is not None  # no ETag was sent, so no 304
        return data

    def prefetch(self, shards: Sequence[Hint]) -> None:
        del shards  # nothing to fetch ahead into without a cache

    def stats(self) -> dict[str, float]:
        return self.counters.snapshot()

    def __repr__(self) -> str:
        return f"RemoteOpener(cache_dir=None, allow_pipe={self.cfg.allow_pipe})"
