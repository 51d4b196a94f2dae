"""Bytes from somewhere: the one seam every shard, index and manifest read goes through.

``shardkit.cache.make_opener(io, cache_dir=...)`` returns the opener a data set reads
through: local paths and ``file://`` urls are read in place; ``http(s)://``
(:mod:`shardkit.io.http`), ``s3://`` (:mod:`shardkit.io.s3`), ``gs://`` and ``az://``
(:mod:`shardkit.io.blobs`) are streamed with ranged requests, retries and resume, through
the node-local cache (:mod:`shardkit.cache`) when a cache dir is given. ``pipe:CMD`` runs
a command and is refused unless the caller sets ``IoConfig(allow_pipe=True)`` in code (a
manifest can never turn it on). Every option is one of :class:`IoConfig`'s, set and read
by its concern (:class:`RetryPolicy`, :class:`CacheConfig`, :class:`ReaderLimits`).

Choice on a full disk (or any cache write failure): a :class:`CacheError` is logged and
counted (``stats()["cache_errors"]``) and the read goes on without the cache; pass
``on_cache_error="raise"`` to get the error instead.
"""

from __future__ import annotations

import os

from shardkit._types import Opener
from shardkit.errors import ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import CacheConfig, IoConfig, ReaderLimits
from shardkit.io.local import open_local
from shardkit.io.remote import UncachedOpener
from shardkit.io.retry import RetryPolicy
from shardkit.urls import local_path, url_scheme

__all__ = [
    "CacheConfig",
    "IoConfig",
    "Opener",
    "ReaderLimits",
    "RetryPolicy",
    "UncachedOpener",
    "load_manifest",
    "manifest_source",
    "open_local",
]


def manifest_source(source: str) -> str:
    """``source`` as a manifest: a local folder (the ``-o`` a build was given) is the
    ``manifest.json`` in it, a :class:`ManifestError` naming that file where it has none;
    anything else is returned as given."""
    if url_scheme(source) != "file" or not os.path.isdir(local_path(source)):
        return source
    path = os.path.join(local_path(source), "manifest.json")
    if not os.path.isfile(path):
        raise ManifestError(
            f"{source} is a folder without a manifest: {path} is absent (a build's -o "
            f"holds one; `shardkit manifest from-shards {source}` writes one for shards)"
        )
    return path


def load_manifest(source: str, opener: Opener | None = None) -> Manifest:
    """Load the manifest at ``source`` (a path or url, or a local folder holding a
    ``manifest.json``: :func:`manifest_source`) through ``opener``.

    With a caching opener a remote manifest is fetched once per node and shared (see
    :mod:`shardkit.cache.manifests`).
    """
    if url_scheme(source) == "file":
        return Manifest.load(local_path(manifest_source(source)))
    opener = opener or UncachedOpener(IoConfig())
    return Manifest.loads(opener.fetch_manifest(source), source=source)
