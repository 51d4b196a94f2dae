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
from urllib.parse import urlsplit

from shardkit._types import Opener
from shardkit.errors import ConfigError, FetchError, ManifestError, redact
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import CacheConfig, IoConfig, ReaderLimits
from shardkit.io.local import open_local
from shardkit.io.remote import UncachedOpener
from shardkit.io.retry import RetryPolicy
from shardkit.urls import HTTP_SCHEMES, OBJECT_SCHEMES, local_path, parse_url, url_scheme

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

MANIFEST_NAME = "manifest.json"  # what a folder, local or remote, is read as
_FOLDER_SCHEMES = (*HTTP_SCHEMES, *OBJECT_SCHEMES, "hf")


def _existing_part(path: str) -> int:
    """The length of the longest leading part of the local ``path`` that exists."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path.rstrip(os.sep))
        if parent == path:
            return 0
        path = parent
    return len(path)


def _refuse_a_folder_with_a_suffix(source: str, scheme: str) -> None:
    """A folder given with a ``?query`` or ``#fragment`` (``http://h/data/?x=1``,
    ``file:///d/#a``, a local ``/d/#a`` that does not exist where ``/d/`` does) is a
    :class:`ConfigError` naming the folder: a folder is read as its ``manifest.json``, which
    the suffix would not reach. So is any ``file://`` url with one (reading the file would
    drop it: another name than the one given)."""
    cuts = [i for i, c in enumerate(source) if c in "?#"]
    if not cuts:
        return
    head = source[: cuts[0]]
    if scheme == "file" and head.startswith("file://"):
        folder = os.path.isdir(local_path(head))
    elif scheme == "file":  # a local name may hold '?' or '#': only a folder before them
        real = _existing_part(source)  # a '?' or '#' in it is a letter of a real name
        heads = [source[:i] for i in cuts if i >= real]
        head = next((h for h in heads if os.path.isdir(h)), head)
        folder = os.path.isdir(head) and bool(heads)
    else:  # a remote object's url is the url parser's to take or refuse
        folder = scheme in _FOLDER_SCHEMES and head.endswith("/")
        if folder:
            parse_url(head)  # what it refuses (credentials, '..') it names first
    tail = source[len(head) :]
    if folder:
        why = (
            f"a folder is read as its {MANIFEST_NAME}, which {tail[0]!r} would not reach; "
            f"give the folder alone ({head!r}) or its manifest's own url"
        )
    elif head.startswith("file://"):
        why = "a file:// url has no query or fragment; percent-encode '?' as %3F, '#' as %23"
    else:
        return
    raise ConfigError(redact(f"refusing {source!r}: {tail!r} follows {head!r}: {why}"))


def _refuse_another_host(source: str) -> None:
    """A ``file://`` url naming a host other than this one (``file://nas/d/``) is a
    :class:`ConfigError`: its path would be read from this machine's disk."""
    if not source.startswith("file://"):
        return
    host = urlsplit(source).netloc
    if host.lower() not in ("", "localhost"):
        raise ConfigError(
            redact(
                f"refusing {source!r}: {host!r} is another host, and a file:// url is read "
                "from this machine's files; mount it and give the local path"
            )
        )


def manifest_source(source: str) -> str:
    """``source`` as a manifest: a folder is the ``manifest.json`` in it. A local folder
    (the ``-o`` a build was given) without one is a :class:`ManifestError` naming that
    file; a remote folder (an ``http(s)://``, ``s3://``, ``gs://``, ``az://`` or ``hf://``
    url ending in ``/``) is checked as every url is (a :class:`ConfigError` for what the url parser
    refuses) and its ``manifest.json`` is read when the manifest is (:func:`load_manifest`
    names the url tried where there is none). A folder followed by a ``?query`` or
    ``#fragment``, and a ``file://`` url with one, is a :class:`ConfigError` naming what
    to give instead. Anything else is returned as given."""
    scheme = url_scheme(source)
    _refuse_another_host(source)
    _refuse_a_folder_with_a_suffix(source, scheme)
    # a prefix is a folder here (the rest is refused as ever); a query is never one
    if scheme in _FOLDER_SCHEMES and source.endswith("/") and not parse_url(source).query:
        return source + MANIFEST_NAME
    if scheme != "file" or not os.path.isdir(local_path(source)):
        return source
    path = os.path.join(local_path(source), MANIFEST_NAME)
    if not os.path.exists(path):  # one that is there but no file is refused by its read
        raise ManifestError(
            f"{source} is a folder without a manifest: {path} is absent (a build's -o "
            f"holds one; `shardkit manifest from-shards {source}` writes one for shards)"
        )
    return path


def load_manifest(source: str, opener: Opener | None = None) -> Manifest:
    """Load the manifest at ``source`` (a path or url, or a folder holding a
    ``manifest.json``: :func:`manifest_source`) through ``opener``.

    With a caching opener a remote manifest is fetched once per node and shared (see
    :mod:`shardkit.cache.manifests`).
    """
    url = manifest_source(source)
    if url_scheme(url) == "file":
        return Manifest.load(local_path(url))
    opener = opener or UncachedOpener(IoConfig())
    try:
        data = opener.fetch_manifest(url)
    except FetchError as exc:
        if url == source or exc.status not in (403, 404):
            raise
        raise ManifestError(
            f"{source} is a folder without a manifest: {url} could not be read ({exc}); a "
            f"build's -o holds one, or name the manifest's url"
        ) from exc
    return Manifest.loads(data, source=url)
