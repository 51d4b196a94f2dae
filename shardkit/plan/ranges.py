"""An ordered sequence of sample references, kept as ranges ``(shard, lo, hi)`` in numpy
arrays: cut, picked from, wrapped and joined without a loop over its ranges."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Ranges", "coalesce", "take_many"]


@dataclass(frozen=True)
class Ranges:
    """An ordered sequence of sample references as ranges ``[lo, hi)`` of shards."""

    shard: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[tuple[int, int, int]]) -> Ranges:
        arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return cls(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())

    @classmethod
    def concat(cls, parts: Sequence[Ranges]) -> Ranges:
        if not parts:
            return cls.of([])
        return coalesce(
            np.concatenate([p.shard for p in parts]),
            np.concatenate([p.lo for p in parts]),
            np.concatenate([p.hi for p in parts]),
        )

    def __len__(self) -> int:
        return len(self.shard)

    @property
    def total(self) -> int:
        return int((self.hi - self.lo).sum())

    def rows(self) -> list[tuple[int, int, int]]:
        return list(zip(self.shard.tolist(), self.lo.tolist(), self.hi.tolist(), strict=True))

    def _ends(self) -> np.ndarray:
        return np.cumsum(self.hi - self.lo)

    def take(self, start: int, stop: int) -> Ranges:
        """The sub-sequence of positions ``[start, stop)``."""
        stop = min(stop, self.total)
        if stop <= start:
            return Ranges.of([])
        ends = self._ends()
        i = int(np.searchsorted(ends, start, side="right"))
        j = int(np.searchsorted(ends, stop, side="left"))
        shard, lo, hi = self.shard[i : j + 1], self.lo[i : j + 1].copy(), self.hi[i : j + 1].copy()
        begins = ends[i : j + 1] - (hi - lo)
        lo[0] += start - int(begins[0])
        hi[-1] -= int(ends[j]) - stop
        return Ranges(shard.copy(), lo, hi)

    def pick(self, positions: np.ndarray) -> Ranges:
        """The samples at sorted ``positions``, consecutive ones merged into ranges."""
        if len(positions) == 0:
            return Ranges.of([])
        ends = self._ends()
        i = np.searchsorted(ends, positions, side="right")
        idx = self.lo[i] + positions - (ends[i] - (self.hi[i] - self.lo[i]))
        return coalesce(self.shard[i], idx, idx + 1)

    def shards(self) -> list[int]:
        """The shards this sequence reads, each once, in the order it first reads them."""
        _, first = np.unique(self.shard, return_index=True)
        return [int(x) for x in self.shard[np.sort(first)]]

    def iter_ranges(self, start: int) -> Iterator[tuple[int, int, int, int]]:
        """Yield ``(shard, lo, hi, stream position of lo)`` from stream position ``start``."""
        pos = start
        for shard, lo, hi in self.take(start, self.total).rows():
            yield shard, lo, hi, pos
            pos += hi - lo

    def wrap(self, length: int) -> Ranges:
        """This sequence repeated from its start until it is ``length`` long."""
        total = self.total
        if length <= total or total == 0:
            return self.take(0, length)
        reps, rest = divmod(length, total)
        return Ranges.concat([self] * reps + [self.take(0, rest)])


def coalesce(shard: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Ranges:
    """Drop empty ranges and merge a range with the next when they are contiguous."""
    keep = hi > lo
    shard, lo, hi = shard[keep], lo[keep], hi[keep]
    if len(shard) > 1:
        joins = (shard[1:] == shard[:-1]) & (lo[1:] == hi[:-1])
        if joins.any():
            starts = np.flatnonzero(np.concatenate(([True], ~joins)))
            stops = np.concatenate((starts[1:], [len(shard)])) - 1
            return Ranges(shard[starts], lo[starts], hi[stops])
    return Ranges(shard, lo, hi)


def take_many(seq: Ranges, starts: np.ndarray, stops: np.ndarray) -> Ranges:
    """Positions ``[starts[k], stops[k])`` of ``seq`` for every ``k``, in turn, as one
    sequence: one cumulative sum and one binary search per part, whatever their number."""
    stops = np.minimum(stops, seq.total)
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if len(starts) == 0 or len(seq) == 0:
        return Ranges.of([])
    ends = seq._ends()
    first = np.searchsorted(ends, starts, side="right")
    last = np.searchsorted(ends, stops, side="left")
    nrows = last - first + 1
    part = np.repeat(np.arange(len(starts)), nrows)
    # row indexes first[k] .. last[k] for every part k, without a Python loop
    step = np.ones(int(nrows.sum()), dtype=np.int64)
    heads = np.concatenate(([0], np.cumsum(nrows)[:-1]))
    step[heads] = first - np.concatenate(([0], last[:-1]))
    row = np.cumsum(step)
    shard, lo, hi = seq.shard[row], seq.lo[row], seq.hi[row]
    begins = ends[row] - (hi - lo)
    lo = lo + np.maximum(0, starts[part] - begins)
    hi = hi - np.maximum(0, ends[row] - stops[part])
    return coalesce(shard, lo, hi)
