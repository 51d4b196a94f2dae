"""The shard writer: samples in, whole shards, sample indexes and a manifest out, in a local
folder or an object-store prefix (the writer's target)."""

from shardkit.write.writer.options import (
    COMPRESSIONS,
    DEFAULT_CHECKSUM,
    DEFAULT_PREFIX,
    WriterKeywords,
    WriterOptions,
    shard_name,
    shard_suffix,
)
from shardkit.write.writer.shard_writer import ShardWriter

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_CHECKSUM",
    "DEFAULT_PREFIX",
    "ShardWriter",
    "WriterKeywords",
    "WriterOptions",
    "shard_name",
    "shard_suffix",
]
