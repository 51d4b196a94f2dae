"""The one sample a lookup's bytes hold, parsed: bytes ``[start, end)`` of a shard, which its
sample index gives one sample (:mod:`shardkit.read.lookup`).

The common case, plain ustar members of one key, is parsed here without setting up the tar
reader (:func:`_plain_sample`: ~10 us less a lookup); anything else, or any doubt, goes to
the tar reader, which names what is wrong. The sample found must carry the signature the
index gives it, and the bytes must hold exactly one sample: a wrong index is a
:class:`ShardFormatError`, never another sample.
"""

from __future__ import annotations

from typing import BinaryIO, cast

from shardkit._types import Sample
from shardkit.errors import ShardFormatError
from shardkit.format.compression import sniff
from shardkit.format.tario.headers import BLOCK, plain_member
from shardkit.format.tario.reader import TarReader
from shardkit.io.config import ReaderLimits
from shardkit.read.shards import ShardInfo
from shardkit.read.stream import check_no_more, check_signature

__all__ = ["parse_sample"]


def parse_sample(
    data: bytes,
    info: ShardInfo,
    start: int,
    end: int,
    signature: int | None,
    j: int,
    counts: dict[str, float],
    *,
    limits: ReaderLimits,
) -> Sample:
    """The one sample ``data`` (bytes ``[start, end)`` of the shard) holds, sample ``j`` of
    the shard by its index; ``signature``: what it must carry (None: not checked);
    ``limits``: the reader's (``max_member``, ``tar_policy``)."""
    url = info.ref.url
    if start == 0:
        kind = sniff(data[:8])
        if kind is not None:
            raise ShardFormatError(
                f"the shard is {kind}-compressed, but its name does not say so: "
                "name it .tar.zst / .tar.gz (its index offsets are in the tar)",
                url=url,
                offset=0,
            )
    sample = _plain_sample(data, limits.max_member)
    if sample is None:  # anything else, or any doubt: the tar reader decides
        sample = _read_tar(data, info, (start, end), signature, j, counts, limits)
    elif signature is not None:
        check_signature(sample, signature, info, j)
    sample["__url__"] = url
    return sample


def _read_tar(
    data: bytes,
    info: ShardInfo,
    span: tuple[int, int],
    signature: int | None,
    j: int,
    counts: dict[str, float],
    lim: ReaderLimits,
) -> Sample:
    """The one sample ``data`` (bytes ``span`` of the shard) holds, parsed by the tar
    reader (which names the error), its signature checked."""
    start, end = span
    url = info.ref.url
    reader = TarReader(
        cast(BinaryIO, _Held(data)), url=url, start=start, end=end, size=info.ref.size,
        max_member=lim.max_member, policy=lim.tar_policy,
    )  # fmt: skip
    samples = reader.samples()
    found = next(samples, None)
    if found is None:
        raise ShardFormatError(
            f"the sample index gives sample {j} the bytes {start}..{end}, which hold no "
            "sample: the index is wrong; rewrite it with `shardkit manifest from-shards`",
            url=url,
            offset=start,
        )
    if signature is not None:  # first: where the index sends a lookup names it best
        check_signature(found[1], signature, info, j)
    check_no_more(samples, f"sample {j} by the index holds", url)
    if reader.skipped_members:
        counts["skipped_members"] = counts.get("skipped_members", 0) + reader.skipped_members
    return found[1]


def _plain_sample(data: bytes, max_member: int) -> Sample | None:
    """The sample ``data`` holds when it is the common case the tar reader's own fast path
    takes (:meth:`~shardkit.format.tario.reader.TarReader.samples`): plain ustar regular
    files with plain names (:func:`~shardkit.format.tario.headers.plain_member`), each
    within ``max_member``, one key, each field once, ending where ``data`` ends; else None
    (the tar reader parses it and names what is wrong). No reader to set up: ~10 us less
    a lookup."""
    sample: Sample = {}
    key = None
    p, n = 0, len(data)
    while p < n:
        if n - p < BLOCK:
            return None
        plain = plain_member(data, p)
        if plain is None:
            return None
        name, size = plain
        stop = p + BLOCK + size
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if size > max_member or stop + (-size) % BLOCK > n or dot <= slash + 1:
            return None
        field = name[dot + 1 :]
        if key is None:
            key = sample["__key__"] = name[:dot]
        elif name[:dot] != key or field in sample:
            return None
        sample[field] = data[p + BLOCK : stop]
        p = stop + (-size) % BLOCK
    return sample if key is not None else None


class _Held:
    """A read-only stream over bytes in memory that hands them out without a copy where it
    can (the tar reader slices its fields from them)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        pos, data = self._pos, self._data
        if pos == 0 and (n < 0 or n >= len(data)):
            self._pos = len(data)
            return data
        stop = len(data) if n < 0 else min(len(data), pos + n)
        self._pos = stop
        return data[pos:stop]

    def seekable(self) -> bool:
        return False
