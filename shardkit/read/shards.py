"""The shard list a source reads: from a manifest, a url list or a brace pattern, or a
manifest's compact form.

Everything goes through the io seam's opener, never ``open()``, so remote urls and the
node-local cache work unchanged. A url list has no sample counts: they are read from each
shard's sample index (one 16-byte read) or, without one, by scanning the shard. The shards
of a compact form are made one at a time, when asked for (:class:`CompactShards`).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload
from urllib.parse import urlsplit

from shardkit._types import ObjectRef
from shardkit.cache.locks import locked
from shardkit.errors import FetchError, ManifestError
from shardkit.format.compression import open_tar
from shardkit.format.layout import index_name, legacy_index_name
from shardkit.format.manifest.compact import Compact, build_or_keep, compact_path, load_compact
from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.format.tario.index import INDEX_MAGICS
from shardkit.format.tario.reader import iter_samples
from shardkit.io import Opener, load_manifest
from shardkit.urls import dirname, expand_braces, url_scheme

__all__ = ["CompactShards", "ShardInfo", "check_complete", "load_catalog", "open_compact"]

log = logging.getLogger(__name__)
_HEAD = struct.Struct("<8sQ")
_KEEP_INFOS = 4096  # ShardInfos a CompactShards keeps made (random access asks again and again)


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
    """By its name: a url's path (not its query or fragment), a local path's whole name
    (where '?' and '#' are letters)."""
    path = source if url_scheme(source) == "file" else urlsplit(source).path
    return path.lower().endswith((".json", ".csv"))


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
        check_complete(incomplete_reason(source), name, allow_incomplete)
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


def check_complete(why: str | None, name: str | None, allow_incomplete: bool) -> None:
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
