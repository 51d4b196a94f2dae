"""The manifest, fetched once per node and shared by every rank and worker on it.

The first process to want a remote manifest takes its lock in the cache dir and fetches it
(a conditional GET with the ETag of the copy it has, if any); the others wait on that lock
and then read the copy. A copy younger than ``manifest_ttl`` seconds is used without
asking the server at all, so a node's startup costs one request however many processes
it runs; an older one costs one conditional request (304 when unchanged). A copy that
cannot be written (a full disk) is a warning and a counter: the bytes are returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time

from shardkit.cache.locks import locked
from shardkit.cache.store import CacheStore
from shardkit.counters import Counters
from shardkit.durable import atomic_write
from shardkit.io.remote import RangeFetcher

__all__ = ["fetch_manifest_once"]

log = logging.getLogger(__name__)


def fetch_manifest_once(
    store: CacheStore, url: str, fetcher: RangeFetcher, *, ttl: float, counters: Counters
) -> bytes:
    """The bytes of the manifest at ``url``, via the node's copy in ``store``: named by
    where it lives in full (``fetcher.location``: for ``s3://`` the endpoint, region and
    profile too), never by the url's text, so one url on two stores is two copies."""
    store.ensure()
    where = fetcher.location(url)
    base = os.path.join(store.root, "manifests", hashlib.sha256(where.encode()).hexdigest()[:32])
    path, etag_path = base + ".json", base + ".etag"
    with locked(base + ".lock"):
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            age = None
        if age is not None and age < ttl:
            counters.add("manifest_cache_hits")
            return _read(path)
        etag = _read(etag_path).decode() if age is not None and os.path.exists(etag_path) else None
        data, new_etag = fetcher.get(url, etag=etag)
        if data is None:
            log.info("%s: not modified since the node's copy", url)
            os.utime(path)
            counters.add("manifest_cache_hits")
            return _read(path)
        try:
            atomic_write(path, data)
            if new_etag:
                atomic_write(etag_path, new_etag.encode())
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(etag_path)
        except OSError as exc:  # a full disk: the bytes are here, the copy is for later
            log.warning("%s: no room for the node's copy of the manifest (%s)", url, exc)
            counters.add("manifest_copies_not_written")
            with contextlib.suppress(OSError):
                os.unlink(etag_path)  # never an ETag beside an older copy
        return data


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
