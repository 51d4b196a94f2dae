"""Adopting a remote data set: a local manifest and sample indexes for shards left in place.

``shardkit manifest from-shards 'https://host/d/x-{000000..000999}.tar' -o DIR`` reads each
shard once (in parallel), and writes into DIR a manifest that lists the shards by their
absolute urls, beside a sample index per shard (``DIR/.index/x-000000.tar.idx``: the path
under the common prefix, as :func:`shardkit.format.layout.index_name` names it). The manifest
names that prefix in ``origins``; read from the local disk, it may reach the shards there
(see :mod:`shardkit.urls` for why a manifest from elsewhere still may not), so
``ShardDataset("DIR/manifest.json")`` streams the remote shards with splits, cache and exact
resume, with no extra flag.

``-o`` may be an object-store url (``s3://b/d/``): the indexes are put there, and where
the shards lie under it the manifest lists them relative to itself (no ``origins``), so the
data set in the store is whole and can be moved as one.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from urllib.parse import urlsplit

from shardkit._types import ObjectRef, Opener
from shardkit.check.scan import scan_stream
from shardkit.errors import ConfigError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import (
    FieldStats,
    Manifest,
    ShardEntry,
    add_fields,
    creation_info,
)
from shardkit.format.pieces import DEFAULT_PIECE_SIZE
from shardkit.urls import REMOTE_PREFIXES, expand_braces
from shardkit.write.writer.where import open_target

__all__ = ["adopt_remote", "is_remote_pattern"]


def is_remote_pattern(source: str) -> bool:
    """True for an ``http(s)://`` or ``s3://`` url or url pattern."""
    return source.startswith(REMOTE_PREFIXES)


def _origin(urls: list[str]) -> str:
    """The longest common "directory" prefix of ``urls`` (``https://host/d/``)."""
    common = os.path.commonprefix(urls)  # noqa: RUF071 - by character, then cut at a "/"
    origin = common[: common.rfind("/") + 1]
    parts = urlsplit(origin)
    if not parts.netloc or not parts.path.startswith("/"):
        raise ConfigError(
            f"the shards {urls[0]!r}, ... share no host and directory; adopt them apart"
        )
    return origin


def _relative(url: str, origin: str) -> str:
    rel = url[len(origin) :]
    parts = rel.split("/")
    if urlsplit(url).query or not rel or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"cannot name a sample index for {url!r} under {origin!r}")
    return posixpath.normpath(rel)


def adopt_remote(
    pattern: str,
    out_dir: str,
    opener: Opener,
    *,
    algo: str = "sha256",
    index: bool = True,
    piece_size: int | None = DEFAULT_PIECE_SIZE,
    workers: int = 8,
    progress: Callable[[int], object] | None = None,
    on_shard: Callable[[], object] | None = None,
    tar_policy: str = "strict",
) -> tuple[Manifest, str]:
    """A manifest (unsaved) and sample indexes (written) in ``out_dir`` for remote shards.

    ``pattern`` is an ``http(s)://`` or ``s3://`` url with brace ranges, read through
    ``opener`` (``shardkit.cache.make_opener()``). ``workers`` shards
    are read at a time; ``progress(nbytes)`` is called as bytes arrive and ``on_shard()``
    as each shard is done. The first failure (a :class:`FetchError`, a
    :class:`ShardFormatError` naming the shard and byte) stops the rest; no manifest is
    written then. Returns the manifest and its path (``out_dir/manifest.json``).
    ``tar_policy`` is the tar reader's (``"lenient"`` skips links, devices, FIFOs).
    """
    urls = expand_braces(pattern)
    if not all(is_remote_pattern(u) for u in urls):
        raise ConfigError(f"{pattern!r} is not an http(s):// or s3:// url pattern")
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    origin = _origin(urls)
    rels = [_relative(u, origin) for u in urls]
    target = open_target(out_dir)  # where the indexes go: a local folder or a store prefix
    out = target.base
    lock = threading.Lock()

    def count(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    def one(url: str, rel: str) -> tuple[ShardEntry, FieldStats]:
        with opener.open(ObjectRef(url)) as f:
            scan = scan_stream(f, url, algo=algo, nkeys=0, progress=count,
                               piece_size=piece_size, tar_policy=tar_policy)  # fmt: skip
        idx = idx_sum = None
        if index:
            data, idx_sum = scan.index(algo)
            idx = index_name(rel)
            target.put(idx, data)
        if on_shard is not None:
            with lock:
                on_shard()
        return scan.entry(url, idx, idx_sum), scan.fields

    with ThreadPoolExecutor(max_workers=min(workers, len(urls))) as pool:
        futures = [pool.submit(one, u, r) for u, r in zip(urls, rels, strict=True)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            if fut in done and fut.exception() is not None:
                for other in futures:
                    other.cancel()
                raise fut.exception()  # type: ignore[misc]
        results = [fut.result() for fut in futures]
    fields: FieldStats = {}
    for _, f in results:
        add_fields(fields, f)
    created = creation_info(source=f"shardkit manifest from-shards {pattern}")
    entries = [e for e, _ in results]
    origins: tuple[str, ...] = (origin,)
    if origin.startswith(out + "/"):  # in the store, above the shards: listed relative to it
        sub = origin[len(out) + 1 :]
        entries = [dataclasses.replace(e, url=sub + r) for e, r in zip(entries, rels, strict=True)]
        origins = ()
    m = Manifest(entries, algo, fields, created, base=out, origins=origins)
    return m, f"{out}/manifest.json"
