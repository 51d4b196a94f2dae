"""The opener protocol: how the streaming side asks for bytes."""

from __future__ import annotations

from typing import BinaryIO, Protocol

__all__ = ["Opener", "read_range", "url_scheme"]


class Opener(Protocol):
    """Turns a resolved url into bytes.

    ``open`` returns a binary stream over ``[start, end)`` of the object (``end`` None:
    to its end); the caller closes it. ``size`` and ``checksum``, when given, are what the
    manifest promises for the whole object, so a caching opener can verify what it stores.
    """

    def open(
        self,
        url: str,
        *,
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        checksum: str | None = None,
    ) -> BinaryIO: ...

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes: ...

    def prefetch(self, shards: list[tuple[str, int | None, str | None]]) -> None:
        """Hint: these ``(url, size, checksum)`` come next in this reader's plan."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters of this process: requests, bytes fetched, retries, cache hits/misses."""
        ...


def url_scheme(url: str) -> str:
    """``"http"``, ``"s3"``, ``"pipe"``, ``"file"`` (local paths included)."""
    if url.startswith("pipe:"):
        return "pipe"
    head, sep, _ = url.partition("://")
    if not sep:
        return "file"
    return head.lower()


def read_range(opener: Opener, url: str, start: int = 0, end: int | None = None) -> bytes:
    """Read ``[start, end)`` of ``url`` through ``opener`` into memory."""
    return opener.read(url, start=start, end=end)
