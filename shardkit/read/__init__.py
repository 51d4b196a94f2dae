"""Reading: the shard catalog (shards, counts, sample indexes) and plan ranges → samples.

A layer between the plan and io: :mod:`.catalog` knows which shards there are and where
sample *i* of a shard starts; :mod:`.stream` turns a stream of ``(shard, lo, hi)`` ranges
into samples through the io opener, under the bad-data policy. Stages build on it.
"""

from __future__ import annotations

from shardkit.read.catalog import Catalog
from shardkit.read.shards import ShardInfo, load_catalog
from shardkit.read.stream import read_stream

__all__ = ["Catalog", "ShardInfo", "load_catalog", "read_stream"]
