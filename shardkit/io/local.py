"""Local files and ``file://`` urls."""

from __future__ import annotations

import io
import os
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from shardkit.errors import FetchError, ManifestError
from shardkit.io.opener import url_scheme

__all__ = ["LocalOpener", "check_within", "local_path", "open_local"]


def local_path(url: str) -> str:
    """The filesystem path of a local path or ``file://`` url."""
    if url.startswith("file://"):
        return unquote(urlsplit(url).path)
    return url


def check_within(url: str, base: str | None) -> None:
    """Refuse a local ``url`` whose real path (every link followed) is outside ``base``.

    A manifest's urls are checked as text when it is loaded; a symbolic link in the shard
    directory can still point anywhere, so where a local shard or index is opened its real
    path is checked too (:class:`ManifestError`). Remote urls and a None base pass.
    """
    if base is None or "://" in base or url_scheme(url) != "file":
        return
    real = os.path.realpath(local_path(url))
    root = os.path.realpath(base)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise ManifestError(
            f"refusing {url!r}: its real path {real!r} (through a symbolic link) is outside "
            f"the manifest's base {root!r} (pass allow_unsafe_urls=True in code to allow it)",
            field="url",
        )


class _Bounded(io.RawIOBase):
    """A raw stream over ``[start, end)`` of an open file."""

    def __init__(self, f: BinaryIO, remaining: int | None) -> None:
        self._f = f
        self._remaining = remaining

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b)
        if self._remaining is not None:
            if self._remaining <= 0:
                return 0
            view = view[: self._remaining]
        n = self._f.readinto(view)  # type: ignore[attr-defined]
        if self._remaining is not None:
            self._remaining -= n
        return int(n)

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            super().close()


def open_local(url: str, *, start: int = 0, end: int | None = None) -> BinaryIO:
    """Open ``[start, end)`` of a local file as a binary stream."""
    path = local_path(url)
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise FetchError(f"cannot open: {exc.strerror}", url=url) from exc
    if start:
        f.seek(start)
    if end is None:
        return f
    return io.BufferedReader(_Bounded(f, end - start), buffer_size=1 << 20)


class LocalOpener:
    """The opener for local paths and ``file://`` urls."""

    def open(
        self,
        url: str,
        *,
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        checksum: str | None = None,
    ) -> BinaryIO:
        del size, checksum  # local files are read in place, not cached
        return open_local(url, start=start, end=end)

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        with self.open(url, start=start, end=end) as f:
            return f.read()

    def prefetch(self, shards: list[tuple[str, int | None, str | None]]) -> None:
        del shards  # local files need no prefetch

    def stats(self) -> dict[str, float]:
        return {}

    def __repr__(self) -> str:
        return "LocalOpener()"


def file_size(url: str) -> int:
    """Size of a local file in bytes."""
    return os.path.getsize(local_path(url))
