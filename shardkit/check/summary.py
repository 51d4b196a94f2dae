"""What is inside a shard set: manifests for foreign shards, summaries.

:func:`manifest_from_shards` gives shards someone else wrote (``webdataset.ShardWriter``,
GNU tar) a manifest and sample indexes, each shard read once
(:func:`~shardkit.check.scan.scan_shard`); :func:`summarize_manifest` and
:func:`summarize_shard` are what ``shardkit inspect`` shows.
"""

from __future__ import annotations

import itertools
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from shardkit.check.scan import ShardScan, scan_shard
from shardkit.durable import atomic_write
from shardkit.errors import ConfigError, ShardFormatError
from shardkit.format.compression import open_tar
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import (
    FieldStats,
    Manifest,
    ShardEntry,
    add_fields,
    creation_info,
)
from shardkit.format.pieces import DEFAULT_PIECE_SIZE
from shardkit.format.tario.reader import TarReader
from shardkit.write.inputs.discover import discover

__all__ = [
    "GOOD_SHARD_BYTES",
    "first_keys",
    "manifest_from_shards",
    "summarize_manifest",
    "summarize_shard",
]

GOOD_SHARD_BYTES = (500_000_000, 2_000_000_000)
"""Shard sizes streaming wants: big enough to amortise a request, small enough to spread."""


def manifest_from_shards(
    source: str,
    *,
    manifest_path: str | None = None,
    algo: str = "sha256",
    index: bool = True,
    progress: Callable[[int], object] | None = None,
    piece_size: int | None = DEFAULT_PIECE_SIZE,
    tar_policy: str = "strict",
) -> tuple[Manifest, str]:
    """A manifest for existing shards: a directory (searched recursively) or a pattern.

    ``tar_policy="lenient"`` skips links, devices, FIFOs and unknown member types (each
    shard's count warned naming it; the manifest and indexes then describe the shards as a
    lenient reader reads them: read them with
    ``IoConfig(limits=ReaderLimits(tar_policy="lenient"))``).

    Each shard is read once (its piece checksums, with ``piece_size``, in the same pass).
    With ``index`` a sample index is written for each shard (in ``.index/`` beside it:
    :func:`shardkit.format.layout.index_name`). Returns the manifest and where it belongs
    (``manifest_path``, by default
    ``manifest.json`` in the directory, or in the shards' common directory); the shards
    must lie under that directory since manifest urls are relative to it. The caller
    saves it.
    """
    units = discover([source], source_type="tar")
    if not units:
        raise ConfigError(f"no .tar, .tar.zst or .tar.gz shards in {source!r}")
    paths = [os.path.abspath(u.path) for u in units]
    if manifest_path is None:
        top = (
            source
            if os.path.isdir(source)
            else os.path.commonpath([os.path.dirname(p) for p in paths])
        )
        manifest_path = os.path.join(top, "manifest.json")
    base = os.path.dirname(os.path.abspath(manifest_path))
    shards: list[ShardEntry] = []
    fields: FieldStats = {}
    for p in paths:
        rel = os.path.relpath(p, base)
        if rel.startswith(".."):
            raise ConfigError(f"shard {p} is outside {base}, where the manifest goes")
        real = os.path.realpath(p)
        if not real.startswith(os.path.realpath(base).rstrip(os.sep) + os.sep):
            raise ConfigError(
                f"shard {p} is a link to {real}, outside {base}, where the manifest goes: "
                "readers would refuse it"
            )
        url = rel.replace(os.sep, "/")
        scan = scan_shard(p, algo=algo, nkeys=0, url=url, progress=progress,
                          piece_size=piece_size, tar_policy=tar_policy)  # fmt: skip
        idx = idx_sum = None
        if index:
            data, idx_sum = scan.index(algo)
            idx = index_name(url)
            path = os.path.join(base, *idx.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, data)
        add_fields(fields, scan.fields)
        shards.append(scan.entry(url, idx, idx_sum))
    created = creation_info(source="shardkit manifest from-shards")
    return Manifest(shards, algo, fields, created, base=base), manifest_path


def first_keys(
    source: str | BinaryIO, n: int = 5, *, url: str | None = None, tar_policy: str = "strict"
) -> list[str]:
    """The first ``n`` sample keys of a shard (a path or a stream, plain or compressed)."""
    if n <= 0:
        return []
    name = url or (source if isinstance(source, str) else "<stream>")
    if isinstance(source, str):
        try:
            raw = open(source, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise ShardFormatError(f"cannot open shard: {exc.strerror}", url=name) from exc
        with raw:
            return first_keys(raw, n, url=name, tar_policy=tar_policy)
    with open_tar(source, url=name) as (tar, _):
        return _take_keys(tar, name, n, tar_policy)


def _take_keys(f: BinaryIO, url: str, n: int, tar_policy: str) -> list[str]:
    """The first ``n`` keys, reading past member data without keeping it."""
    keys: list[str] = []
    for _, s in TarReader(f, url=url, keep_data=False, policy=tar_policy).samples():
        keys.append(str(s["__key__"]))
        if len(keys) >= n:
            break
    return keys


def _spread(values: Sequence[int]) -> dict[str, int]:
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": min(values), "median": round(statistics.median(values)), "max": max(values)}


def _field_rows(fields: FieldStats, nsamples: int) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "count": st.get("count", 0),
            "bytes": st.get("bytes", 0),
            "mean_bytes": round(st.get("bytes", 0) / max(1, st.get("count", 0)), 1),
            "missing": max(0, nsamples - st.get("count", 0)),
        }
        for name, st in sorted(fields.items())
    }


def summarize_manifest(m: Manifest, *, keys: Sequence[str] = ()) -> dict[str, Any]:
    """Totals, shard size spread (and the shards outside 0.5-2 GB), fields, first keys."""
    lo, hi = GOOD_SHARD_BYTES
    last = len(m.shards) - 1
    outside = [
        {"url": s.url, "size": s.size, "last": i == last}
        for i, s in enumerate(m.shards)
        if not lo <= s.size <= hi
    ]
    return {
        "kind": "manifest",
        "shards": len(m.shards),
        "samples": m.total_samples,
        "bytes": m.total_bytes,
        "mean_sample_bytes": round(m.total_bytes / max(1, m.total_samples), 1),
        "checksum_algorithm": m.checksum_algorithm,
        "shard_bytes": _spread([s.size for s in m.shards]),
        "shard_samples": _spread([s.nsamples for s in m.shards]),
        "good_shard_bytes": list(GOOD_SHARD_BYTES),
        "outside_good_range": outside,
        "indexed_shards": sum(1 for s in m.shards if s.index),
        "fields": _field_rows(m.fields, m.total_samples),
        "first_keys": list(keys),
        "part": m.part,
        "created": m.created,
    }


def summarize_shard(scan: ShardScan) -> dict[str, Any]:
    """What one shard holds: size, checksum, samples, the spread of sample sizes, fields."""
    bounds = [*scan.offsets, scan.end]
    sample_bytes = [b - a for a, b in itertools.pairwise(bounds)]
    return {
        "kind": "shard",
        "path": scan.path,
        "bytes": scan.size,
        "checksum": scan.checksum,
        "samples": scan.nsamples,
        "sample_bytes": _spread(sample_bytes),
        "fields": _field_rows(scan.fields, scan.nsamples),
        "first_keys": scan.first_keys,
        "skipped_members": sum(scan.skipped.values()),
    }
