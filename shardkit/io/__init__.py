"""Bytes from somewhere: the one seam every shard, index and manifest read goes through.

``make_opener(...)`` returns the opener a data set reads through: local paths and
``file://`` urls are read in place; ``http(s)://`` (:mod:`shardkit.io.http`) and ``s3://``
(:mod:`shardkit.io.s3`) are streamed with ranged requests, retries and resume, through the
node-local cache (:mod:`shardkit.cache`) when ``cache_dir`` is given. ``pipe:CMD`` runs a
command and is refused unless the caller passes ``allow_pipe=True`` in code (a manifest can
never turn it on). Every option is a field of :class:`IoConfig`.

Choice on a full disk (or any cache write failure): a :class:`CacheError` is logged and
counted (``stats()["cache_errors"]``) and the read goes on without the cache; pass
``on_cache_error="raise"`` to get the error instead.
"""

from __future__ import annotations

import os
from typing import Any

from shardkit.io.config import IoConfig
from shardkit.io.local import LocalOpener, local_path, open_local
from shardkit.io.opener import Opener, read_range, url_scheme
from shardkit.io.remote import RemoteOpener
from shardkit.manifest import Manifest

__all__ = [
    "IoConfig",
    "LocalOpener",
    "Opener",
    "RemoteOpener",
    "load_manifest",
    "make_opener",
    "open_local",
    "opener_for",
    "read_range",
    "url_scheme",
]


def make_opener(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    allow_pipe: bool = False,
    **options: Any,
) -> Opener:
    """The opener a data set reads through.

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
    """The opener for a config: caching when it names a cache dir."""
    if cfg.cache_dir is None:
        return RemoteOpener(cfg)
    from shardkit.cache.opener import CachingOpener  # the cache sits on top of io

    return CachingOpener(cfg)


def load_manifest(source: str, opener: Opener | None = None) -> Manifest:
    """Load the manifest at ``source`` (a path or url) through ``opener``.

    With a caching opener a remote manifest is fetched once per node and shared (see
    :mod:`shardkit.cache.manifests`).
    """
    if url_scheme(source) == "file":
        return Manifest.load(local_path(source))
    opener = opener or make_opener()
    fetch = getattr(opener, "fetch_manifest", None)
    data = fetch(source) if fetch is not None else opener.read(source)
    return Manifest.loads(data, source=source)
