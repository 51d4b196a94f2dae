"""A shard's sample index file against what the manifest says of it: :func:`check_vouched`
compares its bytes with the manifest's ``index_checksum`` (readers trust an index, its
offsets and digests, only where it matches)."""

from __future__ import annotations

from shardkit.check.report import Problem
from shardkit.format.checksum import new_hasher, split_checksum
from shardkit.format.manifest.model import ShardEntry

__all__ = ["check_vouched"]


def check_vouched(entry: ShardEntry, data: bytes) -> Problem | None:
    """The index's bytes ``data`` against the manifest's ``index_checksum`` (readers trust
    an index, its offsets and digests, only where it matches: a lookup refuses one that
    does not)."""
    if entry.index_checksum is None:
        return None
    algo, want = split_checksum(entry.index_checksum)
    h = new_hasher(algo)
    h.update(data)
    got = h.hexdigest()
    if got == want:
        return None
    return Problem(
        entry.url,
        "index",
        f"sample index {entry.index} differs from the manifest's index_checksum (lookups "
        "refuse it): rewrite it with `shardkit manifest from-shards`",
        entry.index_checksum,
        f"{algo}:{got}",
    )
