"""shardkit: WebDataset-format shards with checksum manifests, verified and streamed."""

from __future__ import annotations

from shardkit.errors import (
    CacheError,
    ChecksumError,
    ConfigError,
    DecodeError,
    FetchError,
    ManifestError,
    ShardError,
    ShardFormatError,
    ShardkitError,
    StateDictError,
    WriterError,
)
from shardkit.manifest import Manifest, ShardEntry
from shardkit.tario.reader import read_shard
from shardkit.writer import ShardWriter

__version__ = "0.1.0"

__all__ = [
    "CacheError",
    "ChecksumError",
    "ConfigError",
    "DecodeError",
    "FetchError",
    "Manifest",
    "ManifestError",
    "ShardEntry",
    "ShardError",
    "ShardFormatError",
    "ShardWriter",
    "ShardkitError",
    "StateDictError",
    "WriterError",
    "__version__",
    "read_shard",
]
