"""Reading a worker's stream: shard ranges through the opener, samples out, errors to the policy.

Each range ``(shard, lo, hi)`` is one ranged open: the sample index turns ``lo`` and ``hi``
into byte offsets (a whole shard needs none), so a resume or a rank's share starting in
the middle of a shard costs two 8-byte index reads, not a scan. The opener is told which
shards come next (``prefetch``), and the bytes it hands out are counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterator, Sequence
from typing import Any, BinaryIO

from shardkit.compression import compressed_name, open_tar
from shardkit.errors import ShardFormatError
from shardkit.io import Opener
from shardkit.read.catalog import Catalog, ShardInfo
from shardkit.read.policy import DATA_ERRORS, count_error, report
from shardkit.tario.reader import DEFAULT_MAX_MEMBER, iter_samples, skip_bytes

__all__ = ["read_stream"]

Sample = dict[str, Any]
RangeRow = tuple[int, int, int, int]
_LOOKAHEAD = 8


class _Counting:
    """A read-only stream wrapper that counts the bytes it hands out."""

    def __init__(self, f: BinaryIO, counts: dict[str, float]) -> None:
        self.f = f
        self.counts = counts

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.counts["bytes"] += len(data)
        return data

    def seekable(self) -> bool:
        return False


def read_stream(
    ranges: Iterator[RangeRow],
    catalog: Catalog,
    opener: Opener,
    counts: dict[str, float],
    policy: str,
) -> Generator[tuple[int, Sample], None, None]:
    """Yield ``(stream position, sample)`` for ``(shard, lo, hi, position of lo)`` ranges.

    A range that fails (missing, truncated, hostile, bad checksum) raises under the
    ``raise`` policy; otherwise the rest of it is dropped, logged and counted.
    """
    for shard, lo, hi, spos in _hinted(ranges, catalog.shards, opener):
        got = 0
        try:
            for sample in _read_range(catalog, opener, counts, shard, lo, hi):
                yield spos + got, sample
                got += 1
        except DATA_ERRORS as exc:
            if policy == "raise":
                raise
            counts["skipped_shards"] += 1
            counts["skipped_samples"] += hi - lo - got
            count_error(counts, exc)
            report(policy, exc, f"{hi - lo - got} samples of shard {shard}")


def _hinted(
    ranges: Iterator[RangeRow], shards: Sequence[ShardInfo], opener: Opener
) -> Iterator[RangeRow]:
    """Pass ranges through, telling the opener which shards come next."""
    ahead: deque[RangeRow] = deque()
    for item in ranges:
        ahead.append(item)
        if len(ahead) > _LOOKAHEAD:
            yield _hint_and_pop(ahead, shards, opener)
    while ahead:
        yield _hint_and_pop(ahead, shards, opener)


def _hint_and_pop(ahead: deque[RangeRow], shards: Sequence[ShardInfo], opener: Opener) -> RangeRow:
    cur = ahead.popleft()
    seen = {cur[0]}
    hints = []
    for s, _, _, _ in ahead:
        if s not in seen:
            seen.add(s)
            info = shards[s]
            hints.append((info.url, info.size, info.checksum, info.pieces))
    if hints:
        opener.prefetch(hints)
    return cur


def _read_range(
    catalog: Catalog, opener: Opener, counts: dict[str, float], shard: int, lo: int, hi: int
) -> Iterator[Sample]:
    info = catalog.shards[shard]
    start, end, skip = catalog.byte_range(opener, shard, lo, hi)
    packed = compressed_name(info.url)
    limit = getattr(getattr(opener, "cfg", None), "max_member", DEFAULT_MAX_MEMBER)
    f = opener.open(
        catalog.check_within(info, info.url),
        start=0 if packed else start,
        end=None if packed else end,
        size=info.size,
        checksum=info.checksum,
        pieces=info.pieces,
    )
    with f:
        counted: Any = _Counting(f, counts)
        if packed:  # offsets are in the decompressed tar: decompress from the start
            with open_tar(counted, url=info.url) as (tar, _):
                skip_bytes(tar, start)
                samples = iter_samples(tar, url=info.url, start=start, end=end, max_member=limit)
                yield from _take(samples, info, skip, hi - lo)
            return
        if start == 0:
            with open_tar(counted, url=info.url) as (tar, kind):
                if kind is not None:
                    raise ShardFormatError(
                        f"the shard is {kind}-compressed, but its name does not say so: "
                        "name it .tar.zst / .tar.gz (its index offsets are in the tar)",
                        url=info.url,
                        offset=0,
                    )
                samples = iter_samples(tar, url=info.url, end=end, size=info.size, max_member=limit)
                yield from _take(samples, info, skip, hi - lo)
            return
        samples = iter_samples(
            counted, url=info.url, start=start, end=end, size=info.size, max_member=limit
        )
        yield from _take(samples, info, skip, hi - lo)


def _take(
    samples: Iterator[tuple[int, Sample]], info: ShardInfo, skip: int, want: int
) -> Iterator[Sample]:
    """Drop ``skip`` samples, then yield ``want`` (tagged with ``__url__``)."""
    url = info.url
    got = 0
    for _, sample in samples:
        if skip:
            skip -= 1
            continue
        sample["__url__"] = url
        yield sample
        got += 1
        if got == want:
            return
    raise ShardFormatError(
        f"the shard ends {want - got} samples short of the range asked for; the manifest "
        f"says it holds {info.nsamples}",
        url=url,
    )
