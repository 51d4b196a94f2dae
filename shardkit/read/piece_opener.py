"""An opener for random access without a node cache: ranged reads of remote shards
fetched piece by piece and checked before a byte is handed out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

from shardkit._types import ObjectRef, Opener
from shardkit.io.remote import UncachedOpener, verified_open

__all__ = ["PieceVerified", "piece_verified"]


class PieceVerified:
    """An opener whose ranged reads of remote shards are verified without a node cache.

    A read of a part of a remote shard that has piece checksums fetches the pieces it
    overlaps whole and checks each before a byte is handed out
    (:func:`~shardkit.io.remote.verified_open`). A part of a shard without pieces cannot
    be checked apart from the whole shard: it is refused, naming the fix.
    """

    def __init__(self, remote: UncachedOpener) -> None:
        self.remote = remote

    def open(self, ref: ObjectRef, start: int = 0, end: int | None = None) -> BinaryIO:
        """Stream ``[start, end)`` of ``ref``, verified (see the class docstring)."""
        return verified_open(self.remote, ref, start, end, parts="refuse")

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        """Bytes of an unverified object (an index, a manifest)."""
        return self.remote.read(url, start=start, end=end)

    def prefetch(self, refs: Sequence[ObjectRef]) -> None:
        """Nothing to fill ahead without a cache."""
        del refs

    def stats(self) -> dict[str, float]:
        """The counters of the opener underneath."""
        return self.remote.stats()

    def fetch_manifest(self, url: str) -> bytes:
        """A remote manifest's bytes."""
        return self.remote.fetch_manifest(url)


def piece_verified(opener: Opener) -> Opener:
    """``opener`` with its uncached ranged reads verified piece by piece (see
    :class:`PieceVerified`); a caching opener verifies them already and is kept."""
    if isinstance(opener, UncachedOpener):
        return PieceVerified(opener)
    return opener
