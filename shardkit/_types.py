"""Types every layer may name: a sample, and the opener protocol (how bytes are asked for).

The io layer implements it (local, http, s3), the cache wraps it; the layers below io
(verify, build) take an opener as an argument and never make one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

__all__ = ["ObjectRef", "Opener", "PieceChecksums", "Sample"]

# One sample of a shard set, as WebDataset has it: ``__key__`` (and ``__url__`` once read)
# and one value per field (``bytes`` as stored, until decoded).
Sample = dict[str, Any]


class PieceChecksums(Protocol):
    """What an opener needs of a shard's piece checksums (:class:`shardkit.format.pieces.Pieces`):
    ``size`` bytes a piece, the xxh3-128 ``digests`` in order."""

    @property
    def size(self) -> int: ...

    @property
    def digests(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class ObjectRef:
    """What a manifest promises about one object: where it is (``url``, resolved), its
    ``size``, ``checksum`` (``algo:hex``) and piece checksums; None where it does not say.

    The one value openers, prefetch and the cache pass around (``Opener.open(ref, start,
    end)``): everything verified or named after an object (a cache file, a piece map) is
    derived from it.
    """

    url: str
    size: int | None = None
    checksum: str | None = None
    pieces: PieceChecksums | None = None

    @property
    def verifiable(self) -> bool:
        """Whether its bytes can be checked (a size and a checksum are known)."""
        return self.size is not None and self.checksum is not None


class Opener(Protocol):
    """Turns what a manifest promises about an object into its bytes.

    ``open`` returns a binary stream over ``[start, end)`` of ``ref``'s object (``end``
    None: to its end), verified against what ``ref`` promises (its size, checksum and
    pieces, where it gives them); the caller closes it. ``read`` returns unverified bytes
    of a url (a sample index, a manifest: what has no checksum of its own here).
    """

    def open(self, ref: ObjectRef, start: int = 0, end: int | None = None) -> BinaryIO: ...

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes: ...

    def prefetch(self, refs: Sequence[ObjectRef]) -> None:
        """Hint: these shards come next in this reader's plan."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters of this process: requests, bytes fetched, retries, cache hits/misses."""
        ...

    def fetch_manifest(self, url: str) -> bytes:
        """A remote manifest's bytes (a caching opener shares one fetch per node)."""
        ...
