"""A shard's sample index file against what the manifest says of it.

Plain ``verify`` (level ``checksum``) reads each shard's index whole (24 bytes a sample)
and checks it with :func:`check_index_file`: it is there, it is the one the manifest
vouches for (``index_checksum``, :func:`check_vouched`), well formed, of the shard's sample
count and bound to the shard, as a lookup will check it. ``deep`` compares its offsets with
a parse of the shard too (:mod:`shardkit.check.shard`). Both read it through
:func:`read_index_file`, which reads no more than an index of the shard's samples holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shardkit.check.report import Problem
from shardkit.errors import FetchError, ShardFormatError, ShardkitError
from shardkit.format.checksum import new_hasher, split_checksum
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.tario.index import index_size, parse_index, shard_binding

if TYPE_CHECKING:
    from shardkit._types import Opener

__all__ = ["check_index_file", "check_vouched", "read_index_file"]


def _read_bounded(opener: Opener, url: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``url`` (one more than an index may have)."""
    try:
        return opener.read(url, end=limit + 1)
    except FetchError as exc:
        if exc.status == 416:  # an empty file: no byte at 0 to serve
            return b""
        raise


def _too_large(nsamples: int, limit: int) -> str:
    return f"is larger than an index of {nsamples} samples can be ({limit} bytes)"


def read_index_file(opener: Opener, url: str, nsamples: int) -> bytes:
    """The bytes of the sample index at ``url``: at most the size of the largest index of
    ``nsamples`` samples (a version 3 one); a larger file is no index of the shard, refused
    by name (:class:`ShardFormatError`) without reading it all."""
    limit = index_size(3, nsamples)
    data = _read_bounded(opener, url, limit)
    if len(data) > limit:
        raise ShardFormatError(f"sample index {_too_large(nsamples, limit)}", url=url, offset=limit)
    return data


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
        f"sample index {entry.index} ({len(data)} bytes) differs from the manifest's "
        "index_checksum (lookups refuse it): rewrite it with `shardkit manifest from-shards`",
        entry.index_checksum,
        f"{algo}:{got}",
    )


def _missing(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, FileNotFoundError) or (
        isinstance(exc, FetchError) and exc.status in (404, 410)
    )


def check_index_file(
    manifest: Manifest, entry: ShardEntry, opener: Opener, within: Callable[[str], None]
) -> Problem | None:
    """What is wrong with ``entry``'s sample index file, read whole through ``opener``
    (``within`` refuses a local one whose real path leaves the manifest's base), or None
    (also for a shard with no index)."""
    if entry.index is None:
        return None
    name = entry.index
    try:
        url = manifest.resolve(name)
        within(url)
        data = _read_bounded(opener, url, limit := index_size(3, entry.nsamples))
    except (ShardkitError, OSError) as exc:
        if _missing(exc):
            msg = f"sample index {name} is missing: rewrite it with `shardkit manifest from-shards`"
            return Problem(entry.url, "index", msg, entry.index_checksum, "missing")
        return Problem(entry.url, "index", f"sample index {name}: {exc}")
    if len(data) > limit:
        msg = f"sample index {name} {_too_large(entry.nsamples, limit)}"
        return Problem(entry.url, "index", msg, entry.index_checksum, f"> {limit} bytes")
    bad = check_vouched(entry, data)
    if bad is not None:
        return bad
    try:
        index = parse_index(data, url=name)
    except ShardFormatError as exc:
        return Problem(entry.url, "index", f"sample index {name}: {exc}")
    n = len(index.offsets) - 1
    if n != entry.nsamples:
        msg = f"sample index {name} has a different count"
        return Problem(entry.url, "index", msg, entry.nsamples, n)
    if index.shard is not None and index.shard != shard_binding(entry.checksum):
        return Problem(entry.url, "index", f"sample index {name} belongs to another shard")
    return None
