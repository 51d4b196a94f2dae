"""The uncached opener: every scheme, streamed straight from where it lives.

:class:`UncachedOpener` dispatches on the url's scheme (local path / ``file://``, ``http(s)://``,
``s3://``, ``pipe:``). A whole-object read given the manifest's ``size`` and ``checksum``
is verified on the fly: the last read raises :class:`ChecksumError` on a mismatch, so even
without a cache a corrupt shard is never taken for a good one. A shard with piece checksums
(and every local shard with a checksum, :mod:`shardkit.io.local`) is verified piece by piece
before any byte is handed out; remote ranged reads without pieces are not verified here;
:func:`verified_open` is the one decision of how a read is verified, for every opener
(this one, the node cache's reads of a shard it cannot hold, the random-access reader's).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO, Protocol

from shardkit._types import ObjectRef
from shardkit.counters import Counters
from shardkit.errors import ChecksumError, ConfigError, redact
from shardkit.format.checksum import split_checksum
from shardkit.format.digest import Digest
from shardkit.io.blobs import AzFetcher, BlobFetcher, GsFetcher
from shardkit.io.config import IoConfig
from shardkit.io.http import HttpFetcher
from shardkit.io.hub import HubFetcher
from shardkit.io.local import open_local
from shardkit.io.pipe import check_pipe_allowed, open_pipe
from shardkit.io.retry import Gate
from shardkit.io.s3 import S3Fetcher
from shardkit.io.verified import PieceStream
from shardkit.urls import HTTP_SCHEMES, url_scheme

__all__ = ["ChunkStream", "RangeFetcher", "UncachedOpener", "verified_open", "verified_stream"]


class RangeFetcher(Protocol):
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


def verified_stream(
    fetch: Callable[[int, int | None], Iterator[bytes]],
    ref: ObjectRef,
    start: int,
    stop: int | None,
    counters: Counters,
) -> BinaryIO:
    """``[start, stop)`` of the remote object ``ref`` from ``fetch(lo, hi)``, verified as
    far as ``ref`` lets it be: with pieces no byte before its piece matched
    (:class:`PieceStream`); a whole object without pieces by its checksum at its end
    (:class:`ChunkStream`); a part without pieces unchecked."""
    counters.add("uncached_reads")
    if ref.verifiable and ref.pieces is not None and ref.size:
        assert stop is not None
        return buffered(PieceStream(fetch, ref, start=start, end=stop, counters=counters))
    whole = start == 0 and stop == ref.size
    return buffered(
        ChunkStream(
            fetch(start, stop),
            url=ref.url,
            size=ref.size if whole else None,
            checksum=ref.checksum if whole else None,
        )
    )


def verified_open(
    uncached: UncachedOpener,
    ref: ObjectRef,
    start: int = 0,
    end: int | None = None,
    *,
    parts: str = "stream",
) -> BinaryIO:
    """``[start, end)`` of ``ref`` read without a cache, verified as far as ``ref`` lets it
    be: the one place that decides how, for every opener.

    A ``pipe:`` url runs its command (if allowed in code). With ``verify`` off nothing is
    checked. A local file is verified piece by piece (:func:`open_local`), a remote object
    as :func:`verified_stream` says. A remote part without pieces cannot be checked apart
    from the whole object: ``parts="stream"`` reads it unchecked, ``parts="refuse"``
    refuses it naming the fix.
    """
    url = ref.url
    if url_scheme(url) == "pipe":
        check_pipe_allowed(url, uncached.cfg.allow_pipe)
        return open_pipe(url, start=start, end=end)
    if uncached.cfg.limits.verify == "off":
        ref = ObjectRef(url, ref.size)
    src = uncached.fetcher(url)
    if src is None:
        return open_local(ref, start, end)
    stop = end if ref.size is None else (ref.size if end is None else min(end, ref.size))
    part = not (start == 0 and stop == ref.size)
    if part and ref.pieces is None and ref.checksum is not None and parts == "refuse":
        raise ConfigError(
            f"{url}: a sample of this remote shard cannot be verified without reading "
            "the whole shard (its manifest entry has no piece checksums): give "
            "cache_dir= (the node cache verifies it whole), or rebuild the manifest "
            "with pieces (`shardkit manifest from-shards`)"
        )
    return verified_stream(
        lambda lo, hi: src.stream(url, lo, hi), ref, start, stop, uncached.counters
    )


class UncachedOpener:
    """Reads any scheme without a cache (see the module docstring).

    Args:
        cfg: the io options.
        counters: this process's counters (shared with a caching opener above it).
    """

    def __init__(self, cfg: IoConfig, counters: Counters | None = None) -> None:
        self.cfg = cfg
        self.counters = counters or Counters()
        self.http = HttpFetcher(cfg, self.counters)
        self.hub = HubFetcher(cfg, self.counters)
        self._s3: S3Fetcher | None = None
        self._blobs: dict[str, BlobFetcher] = {}

    def fetcher(self, url: str) -> RangeFetcher | None:
        """The ranged fetcher of a remote url, or None for local and pipe urls."""
        scheme = url_scheme(url)
        if scheme in HTTP_SCHEMES:
            return self.http
        if scheme == "s3":
            if self._s3 is None:
                self._s3 = S3Fetcher(self.cfg, self.counters)
            return self._s3
        if scheme == "hf":
            return self.hub
        if scheme in ("gs", "az"):
            if scheme not in self._blobs:
                kind = GsFetcher if scheme == "gs" else AzFetcher
                self._blobs[scheme] = kind(self.cfg, self.counters)
            return self._blobs[scheme]
        if scheme in ("file", "pipe"):
            return None
        raise ConfigError(f"unsupported url scheme {scheme!r} in {redact(url)!r}")

    def location(self, url: str) -> str:
        """Where the remote ``url`` lives in full (see :meth:`RangeFetcher.location`)."""
        src = self.fetcher(url)
        if src is None:
            raise ConfigError(f"{url!r} is not a remote url")
        return src.location(url)

    def open(self, ref: ObjectRef, start: int = 0, end: int | None = None) -> BinaryIO:
        """Stream ``[start, end)`` of ``ref``, verified as :func:`verified_open` says (a
        remote part without pieces unchecked)."""
        return verified_open(self, ref, start, end)

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        with self.open(ObjectRef(url), start, end) as f:
            return f.read()

    def fetch_manifest(self, url: str) -> bytes:
        """The whole (small) object at ``url``: a manifest."""
        src = self.fetcher(url)
        if src is None:
            return self.read(url)
        data, _ = src.get(url)
        assert data is not None  # no ETag was sent, so no 304
        return data

    def prefetch(self, refs: Sequence[ObjectRef]) -> None:
        del refs  # nothing to fetch ahead into without a cache

    def stats(self) -> dict[str, float]:
        return self.counters.snapshot()

    def __repr__(self) -> str:
        return f"UncachedOpener(cache_dir=None, allow_pipe={self.cfg.allow_pipe})"
