"""The catalog a reader reads through: the shard list (:mod:`shardkit.read.shards`) with
its sample counts and content fingerprint, and cheap ranged reads of each shard's sample
index; :func:`open_catalog` opens one from a source, through a manifest's compact form where
one fits.

Everything goes through the io seam's opener, never ``open()``, so remote urls and the
node-local cache work unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from shardkit.counters import Counters
from shardkit.errors import ManifestError, ShardFormatError
from shardkit.format.manifest.compact import Column, Compact, compact_path, fingerprint
from shardkit.format.manifest.model import Manifest
from shardkit.io import Opener
from shardkit.io.config import IoConfig
from shardkit.io.remote import UncachedOpener
from shardkit.read.indexes import IndexReader
from shardkit.read.remote_compact import open_remote_compact, reopen_remote_compact
from shardkit.read.shards import (
    CompactShards,
    ShardInfo,
    check_complete,
    load_catalog,
    open_compact,
)
from shardkit.urls import REMOTE_SCHEMES, check_within, local_path, url_scheme

__all__ = ["ByteRange", "Catalog", "open_catalog"]

log = logging.getLogger(__name__)


class ByteRange(NamedTuple):
    """Where a sample range lies in a shard (see :meth:`Catalog.byte_range`)."""

    start: int
    end: int | None
    skip: int
    first: int | None = None  # signature the range's first sample must have
    last: int | None = None  # signature its last sample must have


class Catalog:
    """The shard list plus cheap ranged reads of each shard's sample index."""

    def __init__(self, shards: Sequence[ShardInfo]) -> None:
        self.shards = shards
        self._digest: str | None = None
        if isinstance(shards, CompactShards):
            self.counts: np.ndarray = shards.compact.counts
            self._digest = shards.compact.digest
        else:
            self.counts = np.array([s.nsamples for s in shards], dtype=np.int64)
        self.total = int(self.counts.sum())
        self._checked: set[str] = set()
        self._index_reader = IndexReader()
        self._within: set[str] = set()  # local urls whose real path was checked

    def __reduce__(self) -> tuple[Any, ...]:
        shards = self.shards
        if isinstance(shards, CompactShards) and shards.compact.data is None:
            c = shards.compact  # a worker opens the form again (a form in memory pickles)
            args = (shards.manifest_path, shards.allow_unsafe_urls, shards.remote, c.path, c.digest)
            return (_reopen, args)
        return (Catalog, (shards,))

    @property
    def digest(self) -> str:
        """A fingerprint of the shards' content, in order: each one's checksum (its url's
        base name where there is none), size and sample count. A resume state carries it;
        the compact form holds it (computed from its arrays when it was built)."""
        if self._digest is None:
            refs = [s.ref for s in self.shards]
            sizes = np.array([-1 if r.size is None else r.size for r in refs], dtype=np.int64)
            sums = [r.checksum for r in refs]
            if any(c is None for c in sums):
                sums = [r.checksum or r.url.rsplit("/", 1)[-1] for r in refs]
            self._digest = fingerprint(sizes, self.counts, Column.encode(sums))
        return self._digest

    def check_within(self, info: ShardInfo, url: str) -> str:
        """``url`` (the shard's or its index's) once its real path is known to be inside
        the manifest's base: a symbolic link out of the data set is refused where it is
        opened, not only when the manifest is read."""
        if info.base is not None and url not in self._within:
            check_within(url, info.base)
            self._within.add(url)
        return url

    def byte_range(self, opener: Opener, shard: int, lo: int, hi: int) -> ByteRange:
        """Where samples ``[lo, hi)`` of a shard lie, and what a read there must find.

        With a sample index that is a seek (``skip`` 0), and ``first``/``last`` are the
        signatures the samples at either end of the range must have (None where the
        range starts at 0 or runs to the shard's end, or the index has none). Without an
        index the shard is read from its start and the first ``skip`` samples dropped.
        """
        info = self.shards[shard]
        if info.index_url is None and (lo > 0 or hi < info.nsamples):
            url = info.ref.url
            if url not in self._checked:
                self._checked.add(url)
                log.warning(
                    "%s has no sample index: reading a part of it reads from its start", url
                )
            return ByteRange(0, None, lo)
        if lo == 0 and hi >= info.nsamples:
            return ByteRange(0, None, 0)
        assert info.index_url is not None
        self.check_within(info, info.index_url)
        idx = self._index_reader
        start = 0 if lo == 0 else idx.offset(opener, info, lo)
        end = None if hi >= info.nsamples else idx.offset(opener, info, hi)
        if end is not None and end <= start:
            raise ShardFormatError(
                f"sample index gives samples {lo}..{hi} the byte range {start}..{end}",
                url=info.index_url,
            )
        first = idx.signature(opener, info, lo) if lo > 0 else None
        last = idx.signature(opener, info, hi - 1) if end is not None else None
        return ByteRange(start, end, 0, first, last)

    def sample_span(
        self, opener: Opener, shard: int, j: int
    ) -> tuple[int, int, int | None, int | None]:
        """Where sample ``j`` of a shard with a sample index lies, ``(start, end)`` (the
        last one ends where the index says the archive does), the signature the sample
        found there must have (None for a version 1 index), and the digest its bytes must
        have (None where the index has none the manifest vouches for:
        :meth:`~shardkit.read.indexes.IndexReader.digest`)."""
        info = self.shards[shard]
        assert info.index_url is not None
        self.check_within(info, info.index_url)
        start, end, signature, digest = self._index_reader.span(opener, info, j)
        if end <= start:
            raise ShardFormatError(
                f"sample index gives sample {j} the byte range {start}..{end}",
                url=info.index_url,
            )
        return start, end, signature, digest

    def sample_spans(
        self, opener: Opener, shard: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A shard's per-sample ``(offsets, sizes, digests)`` from an index the manifest
        vouches for, or None (:meth:`~shardkit.read.indexes.IndexReader.spans`)."""
        info = self.shards[shard]
        if info.index_url is None:
            return None
        self.check_within(info, info.index_url)
        return self._index_reader.spans(opener, info)


def _reopen(
    manifest_path: str, allow_unsafe_urls: bool, remote: bool, path: str, digest: str
) -> Catalog:
    if remote:
        compact: Compact | None = reopen_remote_compact(manifest_path, path)
    else:
        compact = open_compact(manifest_path)
    if compact is None:
        raise ManifestError("compact form is gone", path=compact_path(manifest_path))
    if compact.digest != digest:  # the plan was made on the other one
        raise ManifestError(
            f"the manifest changed while it was read (content {compact.digest}, the main "
            f"process read {digest}): start again",
            path=manifest_path,
        )
    return Catalog(CompactShards(compact, manifest_path, allow_unsafe_urls, remote=remote))


def _count_in_memory(compact: Compact | None, opener: Opener) -> None:
    """Count a form kept in memory (no room to write it) in the opener's counters."""
    counters = getattr(opener, "counters", None)
    if compact is not None and compact.data is not None and isinstance(counters, Counters):
        counters.add("compact_forms_in_memory")


def _remote_of(opener: Opener, cfg: IoConfig) -> UncachedOpener:
    """The uncached opener under ``opener`` (a caching or piece-verifying one holds it as
    ``remote``), else a new one: its client is made once (an S3 client costs a second)."""
    for found in (opener, getattr(opener, "remote", None)):
        if isinstance(found, UncachedOpener):
            return found
    return UncachedOpener(cfg)


def open_catalog(
    source: str | Sequence[str] | Manifest,
    opener: Opener,
    *,
    allow_unsafe_urls: bool = False,
    allow_incomplete: bool = False,
    io: IoConfig | None = None,
) -> Catalog:
    """The catalog of ``source``; a ``.json`` manifest is read through its compact form
    (:mod:`shardkit.format.manifest.compact`), so a million shards open in a fraction of a
    second: a local one's beside it, a remote one's in the node's cache dir
    (``io.cache.cache_dir``, else the user's; :mod:`shardkit.read.remote_compact`)."""
    scheme = url_scheme(source) if isinstance(source, str) else None
    if scheme is not None and str(source).split("?", 1)[0].lower().endswith(".json"):
        src, remote = str(source), scheme in REMOTE_SCHEMES
        if remote:
            cfg = io or IoConfig()
            where = _remote_of(opener, cfg).location(src)
            compact = open_remote_compact(
                src,
                opener,
                location=where,
                cache_dir=cfg.cache.cache_dir,
                ttl=cfg.cache.manifest_ttl,
            )
            path = src
        else:
            path = local_path(src)
            compact = open_compact(path) if os.path.isfile(path) else None
        _count_in_memory(compact, opener)
        # a url out of the base is refused by the parse, as it names the entry
        if compact is not None and (allow_unsafe_urls or compact.header.get("safe_urls")):
            check_complete(compact.header.get("incomplete"), src, allow_incomplete)
            return Catalog(CompactShards(compact, path, allow_unsafe_urls, remote=remote))
    shards = load_catalog(
        source,
        opener,
        allow_unsafe_urls=allow_unsafe_urls,
        allow_incomplete=allow_incomplete,
        tar_policy=(io or IoConfig()).limits.tar_policy,
    )
    return Catalog(shards)
