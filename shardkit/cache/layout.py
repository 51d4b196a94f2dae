"""What the cache holds and where: keys, records, and small helpers on its files.

Layout under the cache root (shared by every process and job that names it)::

    data/<algo>/<hex[:2]>/<hex>                  verified shards, addressed by checksum
    tmp/<algo>-<hex>-<size>-p<piece>-<table>.part
                                                 a fill in progress: the shard's bytes at
                                                 their offsets, then its piece map (one
                                                 byte a piece, 1 once verified; the
                                                 first, the verdict on the whole shard
                                                 too); named by the piece table
                                                 the map vouches for; kept after a crash,
                                                 and resumed under that table only
    tmp/<...>.part.gone-N                        a given-up temp file a reader still holds
    locks/<algo>-<hex>.lock                      held (flock) by the one process publishing
    locks/evict.lock                             serialises reservations and evictions
    ledger                                       what data/ holds: sizes, last use
                                                 (see :mod:`shardkit.cache.ledger`)
    slots/slot-NNN.lock                          the per-node request cap
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from shardkit._types import PieceChecksums
from shardkit.errors import ConfigError
from shardkit.format.checksum import split_checksum
from shardkit.format.pieces import piece_count

__all__ = [
    "CacheKey",
    "CacheStat",
    "CachedShard",
    "FillPieces",
    "TempFile",
    "inode_of",
    "listdir",
    "scan_data",
    "scan_tmp",
]

_HEX = re.compile(r"[0-9a-f]{16,128}")
_PART = re.compile(
    r"(?P<name>[a-z0-9_]+-[0-9a-f]+)-(?P<size>\d+)-p(?P<piece>\d+)-(?P<table>[0-9a-f]{16}|whole)"
    r"\.part(?P<gone>\.gone-\d+)?"
)


@dataclass(frozen=True)
class CacheKey:
    """Where a shard with a given checksum and size lives in the cache."""

    algo: str
    digest: str
    size: int

    @classmethod
    def of(cls, checksum: str, size: int) -> CacheKey:
        """The key of ``checksum`` (``algo:hex``); a digest that is not hex is refused."""
        algo, digest = split_checksum(checksum)
        if not _HEX.fullmatch(digest):
            raise ConfigError(f"checksum {checksum!r} is not a hex digest; cannot cache it")
        return cls(algo, digest, size)

    @property
    def name(self) -> str:
        return f"{self.algo}-{self.digest}"

    @property
    def checksum(self) -> str:
        return f"{self.algo}:{self.digest}"


@dataclass(frozen=True)
class FillPieces:
    """How a shard is filled and checked: ``count`` pieces of ``piece_size`` bytes, each
    checked against its digest before a reader gets a byte of it; ``piece_size`` 0 (a
    manifest without pieces): one piece, the whole shard, checked against its checksum.

    A fill's temp file holds the shard's bytes at their offsets, then one byte per piece
    (its *map*: 1 once the piece is verified; the first one also carries the *verdict* on
    the whole shard once every piece is: 2 if it does not match its checksum, 3 if it
    does), so the map, the verdict and the bytes they speak of are one inode; it is cut to
    the shard's size when it is published. Its name carries :attr:`table`, so a map is
    only ever read under the piece table it was made with.
    """

    size: int
    piece_size: int = 0
    digests: tuple[str, ...] | None = None

    @classmethod
    def of(cls, size: int, pieces: PieceChecksums | None) -> FillPieces:
        if pieces is None or size == 0:
            return cls(size)
        return cls(size, pieces.size, pieces.digests)

    @property
    def count(self) -> int:
        return piece_count(self.size, self.piece_size) if self.piece_size else 1

    @property
    def table(self) -> str:
        """What the map vouches for: 16 hex digits of the SHA-256 of the piece table
        (``whole``: one piece, the whole shard, checked by its checksum)."""
        if self.digests is None:
            return "whole"
        text = f"{self.piece_size}:{','.join(self.digests)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CachedShard:
    """One verified shard in the cache."""

    path: str
    size: int
    mtime: float


class TempFile(NamedTuple):
    """A temp file in ``tmp/``: a fill's (``retired`` False) or one given up."""

    path: str
    name: str  # the key's name: its publish lock is ``locks/<name>.lock``
    size: int  # the bytes reserved for it: the shard and its piece map
    retired: bool


@dataclass(frozen=True)
class CacheStat:
    """A look at a cache dir (``shardkit cache stat``)."""

    root: str
    shards: int
    bytes: int
    in_use: int
    downloading: int
    downloading_bytes: int
    dead_temp_files: int
    oldest_use: float | None


def inode_of(path: str) -> int | None:
    """The inode ``path`` names now, or None if it names nothing."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def listdir(path: str) -> list[str]:
    """The names in ``path``; none if it is missing or not a directory."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return []
        raise


def scan_data(data: str) -> Iterator[CachedShard]:
    """Every file under ``data/<algo>/<xx>/`` (a cache's verified shards)."""
    for algo in listdir(data):
        for sub in listdir(os.path.join(data, algo)):
            d = os.path.join(data, algo, sub)
            for name in listdir(d):
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(os.path.join(d, name))
                    yield CachedShard(os.path.join(d, name), st.st_size, st.st_mtime)


def scan_tmp(tmp: str) -> Iterator[TempFile]:
    """Every temp file in ``tmp/``, with the bytes reserved for it (named in its name)."""
    for name in listdir(tmp):
        m = _PART.fullmatch(name)
        if m is not None:
            path, retired = os.path.join(tmp, name), m.group("gone") is not None
            size = int(m.group("size"))
            count = FillPieces(size, int(m.group("piece"))).count
            yield TempFile(path, m.group("name"), size + count, retired)
