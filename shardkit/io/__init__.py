"""Bytes from somewhere: the one seam every shard, index and manifest read goes through.

``open_url(url, start=, end=)`` returns a binary stream positioned at byte ``start`` of
``url`` that ends at ``end`` (exclusive) or at the end of the object. Local paths and
``file://`` urls are served here; remote schemes are dispatched to their modules.
``pipe:CMD`` runs a command and is refused unless the caller passes ``allow_pipe=True``
in code (a manifest can never turn it on).
"""

from __future__ import annotations

import os

from shardkit.io.local import LocalOpener, local_path, open_local
from shardkit.io.opener import Opener, read_range, url_scheme
from shardkit.manifest import Manifest

__all__ = [
    "LocalOpener",
    "Opener",
    "load_manifest",
    "make_opener",
    "open_local",
    "read_range",
    "url_scheme",
]


def make_opener(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    allow_pipe: bool = False,
) -> Opener:
    """The opener a data set reads through.

    Local files only so far; remote schemes and the node-local cache plug in here.
    """
    del cache_dir, cache_limit, allow_pipe
    return LocalOpener()


def load_manifest(source: str, opener: Opener | None = None) -> Manifest:
    """Load the manifest at ``source`` (a path or url) through ``opener``."""
    if url_scheme(source) == "file":
        return Manifest.load(local_path(source))
    data = (opener or make_opener()).read(source)
    return Manifest.loads(data, source=source)
