"""The source's cursor: a worker's stream read in plan order (shuffled in a window), and
its position.

The position is how many stream positions were emitted and the last one; a cursor made
from a position seeks (sample index) to the first shard range still needed, re-reads at
most one shuffle window and emits exactly the rest.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from shardkit._types import Opener, Sample
from shardkit.errors import ShardError
from shardkit.io.config import ReaderLimits
from shardkit.plan.order import Window, iter_order, nth_output, resume_window
from shardkit.plan.ranges import Ranges
from shardkit.plan.resampled import ResampledStream
from shardkit.plan.world import Context
from shardkit.read.catalog import Catalog
from shardkit.read.stream import read_stream
from shardkit.stages.base import Cursor

__all__ = ["SourceCursor", "Stream", "last_of", "stream_length"]

Stream = Ranges | ResampledStream
Row = tuple[int, int, int, int]  # shard, first sample, end, stream position of the first


def stream_length(stream: Stream) -> int | None:
    """Positions in ``stream`` (None: endless)."""
    return stream.total if isinstance(stream, Ranges) else stream.length


def last_of(n: int | None, window: Window | None, pos: int) -> int:
    """The stream position of the last of ``pos`` outputs (-1 for none)."""
    if pos == 0:
        return -1
    return nth_output(n, window, pos - 1)


class SourceCursor(Cursor):
    """Samples of one worker's stream from position ``pos`` on.

    Args:
        where: the plan's view of where it runs (rank 0 of 1 unless split by node).
        state: the source's state without its position (stage, seed, manifest...).
        stream: the stream's sample ranges; window: its shuffle window (None: in order).
        pos: outputs already emitted.
        read: ``(catalog, opener, policy, limits)`` to read samples with (``limits``: the
            reader's :class:`~shardkit.io.config.ReaderLimits`).
    """

    def __init__(
        self,
        where: Context,
        state: dict[str, Any],
        stream: Stream,
        window: Window | None,
        pos: int,
        read: tuple[Catalog, Opener, str, ReaderLimits],
    ) -> None:
        super().__init__()
        self.where = where
        self.base = state
        self.stream = stream
        self.window = window
        self.read = read
        self.pos = pos
        self.last = last_of(stream_length(stream), window, pos)
        self.counts: dict[str, float] = {
            "samples": 0,
            "bytes": 0,
            "skipped_shards": 0,
            "skipped_samples": 0,
        }
        self.items = self._plain() if window is None else self._shuffled(window)

    def state(self) -> dict[str, Any]:
        w = self.where
        return {
            **self.base,
            "epoch": w.epoch,
            "world": w.world,
            "rank": w.rank,
            "workers": w.workers,
            "worker": w.worker,
            "position": self.pos,
            "last": self.last,
        }

    def counters(self) -> dict[str, float]:
        return dict(self.counts)

    def _read(self, start: int) -> Generator[tuple[int, Sample], None, None]:
        """Yield ``(stream position, sample)`` from ``start`` on."""
        catalog, opener, policy, limits = self.read
        ranges = self.stream.iter_ranges(start)
        if stream_length(self.stream) is None:  # endless: a skip policy must not spin
            ranges = self._watched(ranges, catalog.total, policy)
        return read_stream(ranges, catalog, opener, self.counts, policy, limits)

    def _watched(self, ranges: Iterator[Row], per_pass: int, policy: str) -> Iterator[Row]:
        """``ranges``, ended by a ShardError when the skip policy dropped three passes over
        the data (at least 1,000 samples) in a row: every shard fails, nothing would come."""
        counts = self.counts
        limit = max(3 * per_pass, 1000)
        mark = (counts["samples"], counts["skipped_samples"])
        for row in ranges:
            if counts["samples"] != mark[0]:
                mark = (counts["samples"], counts["skipped_samples"])
            elif counts["skipped_samples"] - mark[1] >= limit:
                raise ShardError(
                    f"handler={policy!r} skipped {int(counts['skipped_samples'] - mark[1])} "
                    f"samples in a row of an endless resampled stream (3 passes over its "
                    f"{per_pass} samples) and none was read: every shard fails; nothing "
                    "would ever come (handler='raise' shows the first error)"
                )
            yield row

    def _plain(self) -> Iterator[Sample]:
        counts = self.counts
        for spos, sample in self._read(self.pos):
            self.pos = spos + 1
            self.last = spos
            counts["samples"] += 1
            yield sample
        n = stream_length(self.stream)
        if n is not None:
            self.pos, self.last = n, n - 1

    def _shuffled(self, window: Window) -> Iterator[Sample]:
        n = stream_length(self.stream)
        counts = self.counts
        start, stale_below = 0, 0
        left: frozenset[int] = frozenset()
        if self.last >= 0:
            start, left_arr, stale_below = resume_window(n, window, self.last)
            left = frozenset(left_arr.tolist())
        reader = self._read(start)
        buf: dict[int, Any] = {}
        frontier = start
        end = n if n is not None else 1 << 62
        try:
            for chunk in iter_order(n, window, after=self.last):
                for q in chunk.tolist():
                    while frontier <= q:
                        got = next(reader, None)
                        if got is None:
                            frontier = end
                            break
                        spos, sample = got
                        frontier = spos + 1
                        if spos >= stale_below or spos in left:
                            buf[spos] = sample
                    self.pos += 1
                    self.last = q
                    sample = buf.pop(q, None)
                    if sample is not None:
                        counts["samples"] += 1
                        yield sample
        finally:
            reader.close()
