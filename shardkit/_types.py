"""Types every layer may name: a sample, and the opener protocol (how bytes are asked for).

The io layer implements it (local, http, s3), the cache wraps it; the layers below io
(verify, build) take an opener as an argument and never make one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, Union

__all__ = ["Hint", "ObjectRef", "Opener", "PieceChecksums", "Sample"]

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

    The one value openers, prefetch and the cache pass around: everything verified or
    named after an object (a cache file, a piece map) is derived from it.
    """

    url: str
    size: int | None = None
    checksum: str | None = None
    pieces: PieceChecksums | None = None

    @classmethod
    def of(cls, hint: Hint) -> ObjectRef:
        """The ref of a prefetch hint (a ref already, or a 3- or 4-tuple)."""
        if isinstance(hint, ObjectRef):
            return hint
        url, size, checksum, *more = hint
        return cls(url, size, checksum, more[0] if more else None)

    @property
    def verifiable(self) -> bool:
        """Whether its bytes can be checked (a size and a checksum are known)."""
        return self.size is not None and self.checksum is not None


Hint = Union[  # noqa: UP007 - a runtime alias
    ObjectRef,
    tuple[str, int | None, str | None],
    tuple[str, int | None, str | None, PieceChecksums | None],
]
"""A shard coming next: its :class:`ObjectRef`, or (older callers) ``(url, size,
checksum)``, optionally with its pieces."""


class Opener(Protocol):
    """Turns a resolved url into bytes.

    ``open`` returns a binary stream over ``[start, end)`` of the object (``end`` None:
    to its end); the caller closes it. ``size``, ``checksum`` and ``pieces``, when given,
    are what the manifest promises for the whole object, so a caching opener can verify
    what it stores (piece by piece, with ``pieces``).
    """

    def open(
        self,
        url: str,
        *,
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        checksum: str | None = None,
        pieces: PieceChecksums | None = None,
    ) -> BinaryIO: ...

    def read(self, url: str, *, start: int = 0, end: int | None = None) -> bytes: ...

    def prefetch(self, shards: Sequence[Hint]) -> None:
        """Hint: these shards come next in this reader's plan."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters of this process: requests, bytes fetched, retries, cache hits/misses."""
        ...

    def fetch_manifest(self, url: str) -> bytes:
        """A remote manifest's bytes (a caching opener shares one fetch per node)."""
        ...
