"""The node-local shard cache: content-addressed, verified, shared by every process.

See :mod:`shardkit.cache.layout` for the directory layout, :mod:`shardkit.cache.store` for
its guarantees, :mod:`shardkit.cache.opener` for how reads go through it, and
:mod:`shardkit.cache.stream` for reading a shard while it downloads.
"""

from __future__ import annotations

import os
from typing import Any

from shardkit._types import Opener
from shardkit.cache.layout import CachedShard, CacheKey, CacheStat
from shardkit.cache.manifests import fetch_manifest_once
from shardkit.cache.opener import CachingOpener
from shardkit.cache.store import CacheStore
from shardkit.io import IoConfig, UncachedOpener
from shardkit.io.config import misspelled, with_cache

__all__ = [
    "CacheKey",
    "CacheStat",
    "CacheStore",
    "CachedShard",
    "CachingOpener",
    "fetch_manifest_once",
    "make_opener",
    "opener_for",
]


def make_opener(
    io: IoConfig | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    **other: Any,
) -> Opener:
    """The opener a data set reads through: the node-local cache's when a cache dir is
    given, else plain io (local, http(s), s3).

    Args:
        io: the io options (:class:`IoConfig`; default: ``IoConfig()``).
        cache_dir: the node-local cache directory (the shortcut every reader takes for
            ``io.cache.cache_dir``); None reads remote shards uncached.
        cache_limit: bytes the cache may hold (``"500GB"``); None: no limit.
    """
    if other:  # an io option by its own name: an error naming the spelling to use
        raise misspelled("make_opener", other)
    return opener_for(with_cache(io, cache_dir, cache_limit))


def opener_for(cfg: IoConfig) -> Opener:
    """The opener for a config: caching when it names a cache dir (the cache sits on io)."""
    if cfg.cache.cache_dir is None:
        return UncachedOpener(cfg)
    return CachingOpener(cfg)
