"""Random access: global sample ``i`` of a catalog, found and read by itself.

Sample ``i`` (in manifest order) lives in the shard whose cumulative count passes ``i``: a
binary search over the shard starts (in memory, no I/O), then the shard's sample index
gives the byte range of that one sample (two offsets and its signature), and one ranged
read through the opener gets it. The read goes through :func:`read_stream`, so it is
verified as a sequential read is: the sample found there must carry the signature the
index gives it, and the opener checks the bytes (the node cache piece by piece; without a
cache, :func:`piece_verified` reads a remote shard's pieces whole and checks each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

import numpy as np

from shardkit._types import ObjectRef, Opener, Sample
from shardkit.io.config import ReaderLimits
from shardkit.io.remote import UncachedOpener, verified_open
from shardkit.read.catalog import Catalog
from shardkit.read.stream import read_stream

__all__ = ["Locator", "PieceVerified", "piece_verified", "read_sample"]


class Locator:
    """Global sample numbers to ``(shard, sample in shard)``, from the shards' counts."""

    def __init__(self, counts: np.ndarray) -> None:
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.total = int(self.starts[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """The shard holding global sample ``i`` (``0 <= i < total``) and its place there."""
        if not 0 <= i < self.total:
            raise IndexError(f"sample {i} is out of range: the data set has {self.total}")
        shard = int(np.searchsorted(self.starts, i, side="right")) - 1
        return shard, i - int(self.starts[shard])

    def start(self, shard: int) -> int:
        """The global number of a shard's first sample."""
        return int(self.starts[shard])


def read_sample(
    catalog: Catalog,
    opener: Opener,
    shard: int,
    j: int,
    counts: dict[str, float],
    *,
    limits: ReaderLimits | None = None,
) -> Sample:
    """Sample ``j`` of ``shard``: one ranged read, its signature checked (raises on bad data);
    ``limits``: the reader's (``max_member``, ``tar_policy``)."""
    row = iter([(shard, j, j + 1, 0)])
    for _, sample in read_stream(row, catalog, opener, counts, "raise", limits):
        return sample
    raise AssertionError("read_stream yields the sample or raises")  # pragma: no cover


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
