"""shardkit: WebDataset-format shards with checksum manifests, verified and streamed."""

from __future__ import annotations

import typing

from shardkit._version import __version__

# ``sk.build(fn, inputs, out)``: the function shadows the submodule's name on purpose
# (``from shardkit.build import ...`` still reaches the module through sys.modules)
from shardkit.build import build
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
from shardkit.io.config import IoConfig
from shardkit.manifest import Manifest, ShardEntry
from shardkit.tario.reader import read_shard
from shardkit.writer import ShardWriter

if typing.TYPE_CHECKING:
    from shardkit.dataset import ShardDataset
    from shardkit.loader import WebLoader
    from shardkit.mixing import mix

_LAZY = {
    "ShardDataset": "shardkit.dataset",
    "WebLoader": "shardkit.loader",
    "mix": "shardkit.mixing",
}


def __getattr__(name: str) -> object:
    """The streaming names import torch: load them on first use, so the CLI starts fast."""
    if name not in _LAZY:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "CacheError",
    "ChecksumError",
    "ConfigError",
    "DecodeError",
    "FetchError",
    "IoConfig",
    "Manifest",
    "ManifestError",
    "ShardDataset",
    "ShardEntry",
    "ShardError",
    "ShardFormatError",
    "ShardWriter",
    "ShardkitError",
    "StateDictError",
    "WebLoader",
    "WriterError",
    "__version__",
    "build",
    "mix",
    "read_shard",
]
