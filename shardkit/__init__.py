"""shardkit: WebDataset-format shards with checksum manifests, verified and streamed."""

from __future__ import annotations

import typing

from shardkit._version import __version__
from shardkit.check.verify import verify
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
    TransferError,
    WriterError,
)
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.tario.reader import read_shard
from shardkit.io.config import IoConfig
from shardkit.plan.schedule import Schedule

# ``sk.build(fn, inputs, out)``: the function shadows the submodule's name on purpose
# (``from shardkit.write.build import ...`` still reaches the module through sys.modules)
from shardkit.write.build import build
from shardkit.write.writer import ShardWriter

if typing.TYPE_CHECKING:
    from shardkit.streaming.dataset import ShardDataset
    from shardkit.streaming.device import to_device
    from shardkit.streaming.indexed import IndexedShards
    from shardkit.streaming.loader import WebLoader
    from shardkit.streaming.mixing import mix
    from shardkit.streaming.sync import end_process_group

_LAZY = {
    "IndexedShards": "shardkit.streaming.indexed",
    "ShardDataset": "shardkit.streaming.dataset",
    "WebLoader": "shardkit.streaming.loader",
    "end_process_group": "shardkit.streaming.sync",
    "to_device": "shardkit.streaming.device",
    "mix": "shardkit.streaming.mixing",
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
    "IndexedShards",
    "IoConfig",
    "Manifest",
    "ManifestError",
    "Schedule",
    "ShardDataset",
    "ShardEntry",
    "ShardError",
    "ShardFormatError",
    "ShardWriter",
    "ShardkitError",
    "StateDictError",
    "TransferError",
    "WebLoader",
    "WriterError",
    "__version__",
    "build",
    "end_process_group",
    "mix",
    "read_shard",
    "to_device",
    "verify",
]
