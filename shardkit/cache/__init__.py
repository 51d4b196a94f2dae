"""The node-local shard cache: content-addressed, verified, shared by every process.

See :mod:`shardkit.cache.store` for the directory layout and its guarantees,
:mod:`shardkit.cache.opener` for how reads go through it, and
:mod:`shardkit.cache.stream` for reading a shard while it downloads.
"""

from __future__ import annotations

from shardkit.cache.manifests import fetch_manifest_once
from shardkit.cache.opener import CachingOpener
from shardkit.cache.store import CachedShard, CacheKey, CacheStat, CacheStore

__all__ = [
    "CacheKey",
    "CacheStat",
    "CacheStore",
    "CachedShard",
    "CachingOpener",
    "fetch_manifest_once",
]
