"""Resampled streams: whole shards drawn with replacement, weighted by their sample counts,
the same draws on every run of a seed (:func:`~shardkit.plan.order.uniforms`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from shardkit.errors import ConfigError
from shardkit.plan.order import uniforms

__all__ = ["ResampledStream"]

_DRAW_BLOCK = 1024  # draws made at a time


class ResampledStream:
    """An endless (or ``length``-long) stream of whole shards drawn with replacement."""

    def __init__(self, counts: Sequence[int] | np.ndarray, seed: int, length: int | None) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        if len(self.counts) == 0 or int(self.counts.sum()) == 0:
            raise ConfigError("resampled mode needs at least one non-empty shard")
        self.cum = np.cumsum(self.counts).astype(np.float64)
        self.seed = seed
        self.length = length

    def draws(self, first: int, n: int) -> np.ndarray:
        """Shards of draws ``first .. first + n - 1``, weighted by sample count."""
        u = uniforms(self.seed, np.arange(first, first + n, dtype=np.int64))
        picks = np.searchsorted(self.cum, u * self.cum[-1], side="right")
        out: np.ndarray = np.minimum(picks, len(self.counts) - 1).astype(np.int64)
        return out

    def iter_ranges(self, start: int) -> Iterator[tuple[int, int, int, int]]:
        """Yield ``(shard, lo, hi, stream position of lo)`` from stream position ``start``."""
        pos, first = 0, 0
        while self.length is None or pos < self.length:
            shards = self.draws(first, _DRAW_BLOCK)
            first += _DRAW_BLOCK
            for s in shards.tolist():
                n = int(self.counts[s])
                if self.length is not None:
                    n = min(n, self.length - pos)
                if n > 0 and pos + n > start:
                    lo = max(0, start - pos)
                    yield s, lo, n, pos + lo
                pos += n
                if self.length is not None and pos >= self.length:
                    return
