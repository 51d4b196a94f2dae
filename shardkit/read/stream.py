"""Reading a worker's stream: shard ranges through the opener, samples out, errors to the policy.

Each range ``(shard, lo, hi)`` is one ranged open: the sample index turns ``lo`` and ``hi``
into byte offsets (a whole shard needs none), so a resume or a rank's share starting in
the middle of a shard costs two 8-byte index reads, not a scan. The opener is told which
shards come next (``prefetch``), and the bytes it hands out are counted.
"""

from __future__ import annotations

import logging
from array import array
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from time import perf_counter
from typing import Any, BinaryIO

from shardkit._types import ObjectRef, Sample
from shardkit.activity import at, left
from shardkit.errors import ChecksumError, FetchError, ShardError, ShardFormatError
from shardkit.format.compression import compressed_name
from shardkit.format.tario.index import sample_signature
from shardkit.format.tario.reader import TarReader, open_range
from shardkit.io import Opener
from shardkit.io.config import ReaderLimits
from shardkit.io.verified_samples import SampleVerified
from shardkit.read.catalog import ByteRange, Catalog
from shardkit.read.policy import DATA_ERRORS, count_error, report
from shardkit.read.shards import ShardInfo
from shardkit.units import plural
from shardkit.urls import url_scheme

__all__ = ["check_no_more", "check_signature", "read_stream"]

log = logging.getLogger(__name__)

RangeRow = tuple[int, int, int, int]
_LOOKAHEAD = 8


class _Counting:
    """A read-only stream wrapper that counts the bytes it hands out (a seek counts what it
    steps over, back or forth) and the seconds its reads took (``read_s``: I/O and the
    verification of the bytes); it can seek when the stream below can, so the tar reader's
    unbuffered read of large members is not lost to the count."""

    def __init__(self, f: BinaryIO, counts: dict[str, float]) -> None:
        self.f = f
        self.counts = counts

    def read(self, n: int = -1) -> bytes:
        t = perf_counter()
        data = self.f.read(n)
        counts = self.counts
        counts["bytes"] += len(data)
        counts["read_s"] = counts.get("read_s", 0.0) + (perf_counter() - t)
        return data

    def seekable(self) -> bool:
        return bool(self.f.seekable())

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        before = self.f.tell()
        after = self.f.seek(offset, whence)
        self.counts["bytes"] += after - before
        return after

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> _Counting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def read_stream(
    ranges: Iterator[RangeRow],
    catalog: Catalog,
    opener: Opener,
    counts: dict[str, float],
    policy: str,
    limits: ReaderLimits | None = None,
) -> Generator[tuple[int, Sample], None, None]:
    """Yield ``(stream position, sample)`` for ``(shard, lo, hi, position of lo)`` ranges.

    ``limits`` gives the largest tar member a read holds in memory (``max_member``) and
    the tar policy (``tar_policy``: members a lenient read skips are counted in
    ``counts["skipped_members"]`` and warned naming the shard).

    A range that fails (missing, truncated, hostile, bad checksum) raises under the
    ``raise`` policy; otherwise the rest of it is dropped, logged and counted.
    """
    lim = limits or ReaderLimits()
    for shard, lo, hi, spos in _hinted(ranges, catalog.shards, opener):
        got = 0
        try:
            for sample in _read_range(catalog, opener, counts, (shard, lo, hi), lim):
                yield spos + got, sample
                got += 1
        except DATA_ERRORS as exc:
            if policy == "raise":
                raise
            counts["skipped_shards"] += 1
            counts["skipped_samples"] += hi - lo - got
            count_error(counts, exc)
            report(policy, exc, f"{plural(hi - lo - got, 'sample')} of shard {shard}")


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
            hints.append(info.ref)
    if hints:
        opener.prefetch(hints)
    return cur


def _read_range(
    catalog: Catalog,
    opener: Opener,
    counts: dict[str, float],
    row: tuple[int, int, int],
    limits: ReaderLimits,
) -> Iterator[Sample]:
    shard, lo, hi = row
    info = catalog.shards[shard]
    ref = info.ref
    packed = compressed_name(ref.url)
    catalog.check_within(info, ref.url)
    checked = _sample_digests(catalog, opener, row, limits)
    opened: list[SampleVerified] = []
    if checked is not None:  # each sample checked as it is read (no piece buffer)
        bounds, digests = checked
        whole = hi == info.nsamples  # read on through the end-of-archive marker
        where = ByteRange(bounds[0], None if whole else bounds[-1], 0)

        def open_at(pos: int) -> Any:
            f = opener.open(ObjectRef(ref.url, ref.size), pos)  # checked here
            opened.append(
                SampleVerified(
                    f, url=ref.url, bounds=bounds, digests=digests, first=lo,
                    stop=ref.size if whole else None, size=ref.size, counts=counts,
                )
            )  # fmt: skip
            return opened[-1]  # it counts its reads itself: no wrapper's call a read

    else:
        where = catalog.byte_range(opener, shard, lo, hi)

        def open_at(pos: int) -> Any:
            return _Counting(opener.open(ref, pos, None if packed else where.end), counts)

    # offsets are in the decompressed tar: a compressed shard is read from its start
    with open_range(open_at, url=ref.url, start=where.start, packed=packed) as (tar, kind):
        if kind is not None and not packed:
            raise ShardFormatError(
                f"the shard is {kind}-compressed, but its name does not say so: "
                "name it .tar.zst / .tar.gz (its index offsets are in the tar)",
                url=ref.url,
                offset=0,
            )
        size = ref.size if kind is None else None
        reader = TarReader(
            tar, url=ref.url, start=where.start, end=where.end, size=size,
            max_member=limits.max_member, policy=limits.tar_policy,
        )  # fmt: skip
        told = [0]
        offset = lambda: reader.offset  # noqa: E731 - the same callable goes to left()
        at(ref.url, offset)  # where a stall report finds this reader, until left
        gate = _Gate(opened[0], bounds, reader.src) if opened else None
        try:
            for sample in _take(reader.samples(), info, where, lo, hi, gate):
                if reader.skipped:  # rare: a member passed over (counted before the sample)
                    _count_skipped(reader, counts, told)
                yield sample
        except ShardFormatError:
            if gate is not None:  # bytes that do not parse: a damaged sample, if it is one
                gate.stream.settle()
            raise
        finally:
            left(offset)
            _count_skipped(reader, counts, told)


def _sample_digests(
    catalog: Catalog, opener: Opener, row: tuple[int, int, int], limits: ReaderLimits
) -> tuple[array[int], array[int]] | None:
    """``(bounds, digests)`` of samples ``lo..hi`` (where each starts, then where the last
    ends; each one's digest) when they are to be checked one by one: a verified read of a
    local plain tar whose manifest vouches for each sample's digest (a version 3 index
    with its ``index_checksum``); else None (the opener checks pieces). An index that
    cannot be read is warned about once and the read checks pieces (a whole shard needs
    no index; a part of it then meets the same error finding its offsets)."""
    shard, lo, hi = row
    info = catalog.shards[shard]
    ref = info.ref
    if (
        limits.verify != "on"
        or not ref.verifiable
        or url_scheme(ref.url) != "file"
        or compressed_name(ref.url)
    ):
        return None
    try:
        spans = catalog.sample_spans(opener, shard)
    except (ShardError, FetchError) as exc:
        if info.index_url not in _unread:
            _unread.add(info.index_url)
            log.warning("%s; its samples are checked by the shard's pieces", exc)
        return None
    if spans is None:
        return None
    offsets, sizes, digests = spans
    bounds = array("q", offsets[lo:hi].astype("<i8").tobytes())
    bounds.append(int(offsets[hi - 1] + sizes[hi - 1]))
    return bounds, array("Q", digests[lo:hi].astype("<u8").tobytes())


_unread: set[str | None] = set()  # indexes warned about (read by pieces instead)


class _Gate:
    """What a sample must show before it is handed out on a read checked sample by sample:
    it starts where the index says, and every byte up to the next one's start was checked
    (:class:`~shardkit.io.verified_samples.SampleVerified`), the bytes its members came from too:
    the reader hands a sample out once it has read the next sample's first member, whose
    start (``src.member_offset``) is where the sample's bytes end; a member the reader took
    into it from past its end in the index (a header there changed to its key) is bytes of
    the next sample, not checked yet."""

    def __init__(self, stream: SampleVerified, bounds: array[int], src: Any) -> None:
        self.stream = stream
        self.bounds = bounds
        self.src = src

    def error(self, got: int, offset: int, url: str, key: object) -> ChecksumError:
        """The error for the range's sample ``got`` found at ``offset`` that did not pass."""
        bounds = self.bounds
        return ChecksumError(
            f"sample {key!r} at byte {offset} (its members up to byte "
            f"{max(self.src.member_offset, offset)}) is not the one its index checked "
            f"(bytes {bounds[got]}..{bounds[got + 1]}, checked up to "
            f"{self.stream.verified_to}): not read",
            url=url,
            offset=offset,
        )


def _count_skipped(reader: TarReader, counts: dict[str, float], told: list[int]) -> None:
    """Add the members ``reader`` passed over since last told (a lenient read: counted,
    as it goes, so a worker's counters sent with a batch hold them)."""
    n = reader.skipped_members
    if n != told[0]:
        counts["skipped_members"] = counts.get("skipped_members", 0) + n - told[0]
        told[0] = n


def _take(
    samples: Iterator[tuple[int, Sample]],
    info: ShardInfo,
    where: ByteRange,
    lo: int,
    hi: int,
    gate: _Gate | None = None,
) -> Iterator[Sample]:
    """Drop ``where.skip`` samples, then yield samples ``lo..hi`` (tagged ``__url__``).

    A seek must prove it landed where the index says: the first and last samples have the
    signatures the index gives them (key and field names: a range cut at a field boundary
    fails too), and a range that holds more samples than asked is refused. None of this
    costs more than a hash of a few names per range. With a ``gate`` (a read checked
    sample by sample) each sample must also pass it before it is handed out.
    """
    url = info.ref.url
    want = hi - lo
    skip = where.skip
    got = 0
    for offset, sample in samples:
        if skip:
            skip -= 1
            continue
        if gate is not None and (
            offset != gate.bounds[got]
            or gate.stream.verified_to < gate.bounds[got + 1]
            or gate.stream.verified_to < gate.src.member_offset
        ):
            raise gate.error(got, offset, url, sample["__key__"])
        if got == 0 and where.first is not None:
            check_signature(sample, where.first, info, lo)
        if got == want - 1 and where.last is not None:
            check_signature(sample, where.last, info, hi - 1)
        sample["__url__"] = url
        yield sample
        got += 1
        if got == want:
            if (where.end is not None or hi == info.nsamples) and not where.skip:
                check_no_more(samples, f"samples {lo}..{hi} by the index hold", url)
            return
    raise ShardFormatError(
        f"the shard ends {plural(want - got, 'sample')} short of the range asked for; the manifest "
        f"says it holds {info.nsamples}",
        url=url,
    )


def check_no_more(samples: Iterator[tuple[int, Sample]], what: str, url: str) -> None:
    """A :class:`ShardFormatError` if ``samples`` (what ``what`` names, e.g. "samples 3..5
    by the index hold") yields one more sample."""
    extra = next(samples, None)
    if extra is not None:
        raise ShardFormatError(
            f"{what} more samples than that (then {extra[1]['__key__']!r}): the index or the "
            "manifest's count is wrong",
            url=url,
            offset=extra[0],
        )


def check_signature(sample: Sample, want: int, info: ShardInfo, i: int) -> None:
    """A :class:`ShardFormatError` unless ``sample`` (sample ``i`` of the shard ``info``)
    has the signature ``want`` its index gives it (key and field names)."""
    key = str(sample["__key__"])
    if sample_signature(key, [k for k in sample if k != "__key__"]) != want:
        raise ShardFormatError(
            f"the sample index sends sample {i} to sample {key!r} with fields "
            f"{[k for k in sample if k != '__key__']}, not the sample it indexed: the index "
            "is not this shard's or is wrong; rewrite it with `shardkit manifest from-shards`",
            url=info.ref.url,
        )
