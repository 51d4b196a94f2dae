"""Local files and ``file://`` urls."""

from __future__ import annotations

import io
from typing import BinaryIO

from shardkit.errors import FetchError
from shardkit.urls import local_path

__all__ = ["open_local"]


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
