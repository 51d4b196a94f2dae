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
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    allow_pipe: bool = False,
    **options: Any,
) -> Opener:
    """The opener a data set reads through: the node-local cache's when ``cache_dir`` is
    given, else plain io (local, http(s), s3).

    Args:
        cache_dir: the node-local cache directory; None reads remote shards uncached.
        cache_limit: bytes the cache may hold (``"500GB"``); None: no limit.
        allow_pipe: allow ``pipe:CMD`` urls (code only; never from a manifest).
        options: any other :class:`IoConfig` field (``range_size``, ``read_timeout``,
            ``max_attempts``, ``endpoint_url``, ``prefetch_depth``, ``node_requests``, ...).
    """
    cfg = IoConfig.make(
        cache_dir=cache_dir, cache_limit=cache_limit, allow_pipe=allow_pipe, **options
    )
    return opener_for(cfg)


def opener_for(cfg: IoConfig) -> Opener:
    """The opener for a config: caching when it names a cache dir (the cache sits on io)."""
    if cfg.cache.cache_dir is None:
        return UncachedOpener(cfg)
    return CachingOpener(cfg)
