"""The shard options of a :class:`~shardkit.write.writer.ShardWriter`, in one frozen value.

:class:`WriterOptions` says how shards are cut, named and checked (prefix, size and count
limits, checksum, compression, pieces, image quality); where they go and how a writer
treats what the directory holds (``manifest``, ``resume``, ``overwrite``, ``part``) stay
arguments of the writer. The same options travel as keywords (:class:`WriterKeywords`) for
those that pass them on (:class:`shardkit.ray.ShardDatasink`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict

from shardkit.errors import ConfigError
from shardkit.format.checksum import new_hasher
from shardkit.format.pieces import DEFAULT_PIECE_SIZE
from shardkit.units import parse_size
from shardkit.values import as_int

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_CHECKSUM",
    "DEFAULT_PREFIX",
    "WriterKeywords",
    "WriterOptions",
    "shard_name",
    "shard_suffix",
]

COMPRESSIONS = (None, "zstd", "gzip")
_SUFFIX = {None: ".tar", "zstd": ".tar.zst", "gzip": ".tar.gz"}
DEFAULT_PREFIX = "data"
DEFAULT_CHECKSUM = "sha256"


def shard_suffix(compress: str | None) -> str:
    """The shard file suffix for a compression: ``.tar``, ``.tar.zst`` or ``.tar.gz``."""
    return _SUFFIX[compress]


def shard_name(prefix: str, index: int, compress: str | None) -> str:
    """The file name of shard ``index``: ``{prefix}-{index:06d}`` and its suffix."""
    return f"{prefix}-{index:06d}{_SUFFIX[compress]}"


class WriterKeywords(TypedDict, total=False):
    """:class:`WriterOptions`' fields as keywords (``ShardWriter(out, maxcount=100)``)."""

    prefix: str
    maxsize: int | str
    maxcount: int | None
    checksum: str
    compress: str | None
    piece_size: int | str | None
    image_quality: int


@dataclass(frozen=True)
class WriterOptions:
    """How a :class:`~shardkit.write.writer.ShardWriter` cuts, names and checks shards.

    Args:
        prefix: shard names are ``{prefix}-{index:06d}.tar`` (``.tar.zst`` compressed).
        maxsize: roll over before a shard's tar would exceed this many bytes (headers,
            padding and end-of-archive included; a single larger sample gets a shard of
            its own). A number or a string like ``"1GB"``. It counts the uncompressed tar:
            a compressed shard is smaller on disk (and its sample index, in tar offsets,
            stays the same).
        maxcount: roll over after this many samples (None: no count limit).
        checksum: ``sha256`` (default) or another algorithm of :mod:`shardkit.format.checksum`.
        compress: None, ``"zstd"`` (``.tar.zst``) or ``"gzip"`` (``.tar.gz``, which
            webdataset and Hugging Face ``datasets`` read too): whole-shard compression.
        piece_size: bytes per piece of the per-piece checksums (:mod:`shardkit.format.pieces`);
            None: none.
        image_quality: JPEG/WebP quality for PIL images and uint8 arrays written to
            ``jpg``/``webp`` fields (``png`` is lossless).

    Sizes given as strings are parsed when the value is made; a bad option is a
    :class:`ConfigError` saying which.
    """

    prefix: str = DEFAULT_PREFIX
    maxsize: int | str = "1GB"
    maxcount: int | None = None
    checksum: str = DEFAULT_CHECKSUM
    compress: str | None = None
    piece_size: int | str | None = DEFAULT_PIECE_SIZE
    image_quality: int = 90

    def __post_init__(self) -> None:
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise ConfigError(f"bad shard prefix {self.prefix!r}")
        object.__setattr__(self, "maxsize", parse_size(self.maxsize))
        if self.max_bytes < 4096:
            raise ConfigError(f"maxsize {self.maxsize} is too small (at least 4 KB)")
        if self.maxcount is not None:  # True, 2.5 and "3" are no counts
            object.__setattr__(self, "maxcount", as_int(self.maxcount, "maxcount", floats=False))
            if self.maxcount < 1:
                raise ConfigError(f"maxcount must be at least 1, got {self.maxcount}")
        new_hasher(self.checksum)  # validates the name now, not at the first shard
        if self.compress not in COMPRESSIONS:
            raise ConfigError(f"compress must be None, 'zstd' or 'gzip', got {self.compress!r}")
        if self.piece_size is not None:
            object.__setattr__(self, "piece_size", parse_size(self.piece_size))
            if self.piece_bytes is not None and self.piece_bytes < 4096:
                raise ConfigError(f"piece_size {self.piece_size} is too small (at least 4 KB)")
        object.__setattr__(
            self, "image_quality", as_int(self.image_quality, "image_quality", floats=False)
        )
        if not 1 <= self.image_quality <= 100:
            raise ConfigError(f"image_quality must be in 1..100, got {self.image_quality}")

    @property
    def max_bytes(self) -> int:
        """``maxsize`` in bytes."""
        return int(self.maxsize)

    @property
    def piece_bytes(self) -> int | None:
        """``piece_size`` in bytes (None: no piece checksums)."""
        return None if self.piece_size is None else int(self.piece_size)

    def with_keywords(self, keywords: dict[str, Any]) -> WriterOptions:
        """These options with some replaced by keywords; an unknown keyword is refused."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown ShardWriter option {', '.join(unknown)} ({known})")
        return dataclasses.replace(self, **keywords) if keywords else self
