"""The shard list a source reads: from a manifest, a url list or a brace pattern.

Everything goes through the io seam's opener, never ``open()``, so remote urls and the
node-local cache work unchanged. A url list has no sample counts: they are read from each
shard's sample index (one 16-byte read) or, without one, by scanning the shard.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import numpy as np

from shardkit._types import ObjectRef
from shardkit.cache.locks import locked
from shardkit.counters import Counters
from shardkit.errors import FetchError, ManifestError, ShardFormatError
from shardkit.format.compression import open_tar
from shardkit.format.layout import index_name, legacy_index_name
from shardkit.format.manifest.compact import (
    Column,
    Compact,
    build_or_keep,
    compact_path,
    fingerprint,
    load_compact,
)
from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.format.tario.index import INDEX_MAGICS
from shardkit.format.tario.reader import iter_samples
from shardkit.io import Opener, load_manifest
from shardkit.io.config import IoConfig
from shardkit.io.remote import UncachedOpener
from shardkit.read.indexes import IndexReader
from shardkit.read.remote_compact import open_remote_compact, reopen_remote_compact
from shardkit.urls import (
    REMOTE_SCHEMES,
    check_within,
    dirname,
    expand_braces,
    local_path,
    url_scheme,
)

__all__ = ["ByteRange", "Catalog", "CompactShards", "ShardInfo", "load_catalog", "open_catalog"]

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<8sQ")
_U64 = struct.Struct("<Q")
_KEEP_INFOS = 4096  # ShardInfos a CompactShards keeps made (random access asks again and again)


class ByteRange(NamedTuple):
    """Where a sample range lies in a shard (see :meth:`Catalog.byte_range`)."""

    start: int
    end: int | None
    skip: int
    first: int | None = None  # signature the range's first sample must have
    last: int | None = None  # signature its last sample must have


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the reader needs it: what the manifest promises about it (``ref``: its
    resolved url, size, checksum and pieces), its sample count, its sample index (resolved
    url and checksum) and the base a local shard's real path must lie under (links too)."""

    ref: ObjectRef
    nsamples: int
    index_url: str | None = None
    index_checksum: str | None = None
    base: str | None = None


def _is_manifest(source: str) -> bool:
    path = source.split("?", 1)[0].lower()
    return path.endswith((".json", ".csv"))


def load_catalog(
    source: str | Sequence[str] | Manifest,
    opener: Opener,
    *,
    allow_unsafe_urls: bool = False,
    allow_incomplete: bool = False,
    tar_policy: str = "strict",
) -> list[ShardInfo]:
    """The shards of ``source`` with resolved urls, in manifest (or list) order.

    A manifest whose build did not finish (or a merge of only some parts) is refused with
    :class:`ManifestError` saying why, unless ``allow_incomplete``: training on half a data
    set must be a choice, never a surprise. A shard named by url alone, without a sample
    index, is counted by a read under ``tar_policy``.
    """
    name = source if isinstance(source, str) else None
    if isinstance(source, str) and _is_manifest(source):
        source = load_manifest(source, opener)
    if isinstance(source, Manifest):
        _check_complete(incomplete_reason(source), name, allow_incomplete)
        out = []
        base = None if allow_unsafe_urls else source.base
        for e in source.shards:
            url = source.resolve(e.url, allow_unsafe_urls=allow_unsafe_urls)
            index = (
                source.resolve(e.index, allow_unsafe_urls=allow_unsafe_urls) if e.index else None
            )
            ref = ObjectRef(url, e.size, e.checksum, e.pieces)
            out.append(ShardInfo(ref, e.nsamples, index, e.index_checksum, base))
        return out
    urls = expand_braces(source) if isinstance(source, str) else list(source)
    return [_probe(url, opener, tar_policy) for url in urls]


def _check_complete(why: str | None, name: str | None, allow_incomplete: bool) -> None:
    if why is not None:
        if not allow_incomplete:
            raise ManifestError(f"{why}; pass allow_incomplete=True to read it anyway", path=name)
        log.warning("%s: %s", name or "manifest", why)


def _probe(url: str, opener: Opener, tar_policy: str) -> ShardInfo:
    """A shard named by url alone: count its samples from its sample index (in ``.index/``
    beside it, or beside it as data sets written before that hold it) or a scan."""
    for index in (index_name(url), legacy_index_name(url)):
        try:
            head = opener.read(index, start=0, end=_HEAD.size)
        except FetchError:
            continue
        if len(head) == _HEAD.size and head[:8] in INDEX_MAGICS:
            return ShardInfo(ObjectRef(url), int(_HEAD.unpack(head)[1]), index_url=index)
    log.info("%s has no sample index: counting its samples by reading it", url)
    with opener.open(ObjectRef(url)) as f, open_tar(f, url=url) as (tar, _):
        n = sum(1 for _ in iter_samples(tar, url=url, policy=tar_policy))
    return ShardInfo(ObjectRef(url), n)


class CompactShards(Sequence[ShardInfo]):
    """The shards of a manifest's compact form, each made (and its url checked) when
    asked for: nothing per shard is built up front."""

    def __init__(
        self, compact: Compact, manifest_path: str, allow_unsafe_urls: bool, *, remote: bool = False
    ) -> None:
        self.compact = compact
        self.manifest_path = manifest_path  # a remote manifest's url
        self.allow_unsafe_urls = allow_unsafe_urls
        self.remote = remote
        base = dirname(manifest_path) if remote else os.path.dirname(os.path.abspath(manifest_path))
        # an adopted set's origins, honoured (by resolve_url) only for a local manifest
        self._resolver = Manifest(base=base, origins=tuple(compact.header.get("origins") or ()))
        self._base = None if allow_unsafe_urls else self._resolver.base
        self._made: dict[int, ShardInfo] = {}  # recent ones: a lookup asks for one often

    def __len__(self) -> int:
        return len(self.compact)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | Sequence[ShardInfo]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        made = self._made.get(i)
        if made is None:
            if len(self._made) >= _KEEP_INFOS:
                self._made.clear()
            made = self._made[i] = self._make(i)
        return made

    def _make(self, i: int) -> ShardInfo:
        c, unsafe = self.compact, self.allow_unsafe_urls
        url = c.urls[i]
        index = c.index[i]
        if url is None:
            raise ManifestError("no url", path=self.manifest_path, entry=i, field="url")
        ref = ObjectRef(
            self._resolver.resolve(url, allow_unsafe_urls=unsafe),
            int(c.sizes[i]),
            c.checksums[i],
            c.pieces[i],
        )
        return ShardInfo(
            ref,
            int(c.counts[i]),
            None if index is None else self._resolver.resolve(index, allow_unsafe_urls=unsafe),
            c.index_checksums[i],
            self._base,
        )


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


def open_compact(manifest_path: str) -> Compact | None:
    """The compact form of a local manifest: read when one fits, else built once for the
    node - under a lock, so processes starting together build it once - where the
    directory is writable, and kept in memory where it cannot be written (a full disk);
    None where the directory is not writable (the caller parses the JSON)."""
    path = compact_path(manifest_path)
    try:
        return load_compact(path, manifest_path)
    except FileNotFoundError:
        pass
    except (ManifestError, OSError) as exc:
        log.warning("%s: building it again", exc)
    if not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        return None
    with locked(path + ".lock"):
        try:
            return load_compact(path, manifest_path)
        except (FileNotFoundError, ManifestError, OSError):
            return build_or_keep(manifest_path, path)


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
            _check_complete(compact.header.get("incomplete"), src, allow_incomplete)
            return Catalog(CompactShards(compact, path, allow_unsafe_urls, remote=remote))
    shards = load_catalog(
        source,
        opener,
        allow_unsafe_urls=allow_unsafe_urls,
        allow_incomplete=allow_incomplete,
        tar_policy=(io or IoConfig()).limits.tar_policy,
    )
    return Catalog(shards)
