"""Who reads which samples, in what order: a pure function of the shard list and a few ints.

For epoch ``e`` of a data set whose shards hold ``counts[i]`` samples:

1. the shard order is a permutation drawn from ``(seed, e)`` (or the manifest order);
2. the shards' samples, in that order, form one sequence of ``N`` sample references
   ``(shard, index)`` kept as ranges ``(shard, lo, hi)``;
3. every rank gets the same number of samples: rank ``r`` takes positions
   ``[r * per, (r + 1) * per)``. With ``remainder="drop"`` (default) ``per = N // world``
   and the last ``N % world`` samples of this epoch's order are left out (another set every
   epoch, since the order changes); with ``remainder="pad"`` ``per = ceil(N / world)`` and
   the sequence wraps around to its start, so a few samples are read twice. A shard is
   split between ranks by sample range when it straddles a boundary (the sample index
   makes that a seek).
4. workers split their rank's share the same way, contiguously (sizes differ by at most
   one), so every rank has the same per-worker lengths and the same batch counts.

**Elastic resume**: a run of the epoch with another world size or worker count is a
*generation*. Its record (world, workers, the stream positions each ``(rank, worker)``
had emitted - ranks need not be in lockstep - and the shuffle window it used) fixes exactly
which samples it consumed; what is left, in order, is split again among the new ranks and
workers. Nothing consumed is read again and nothing left is lost (beyond the remainder
rule above when what is left does not divide by the new world size).

**Resampled mode** draws shards with replacement, weighted by their sample counts, from a
counter-based generator seeded by ``(seed, epoch, generation, rank, worker)``: an endless
stream per worker, or ``epoch_length`` samples per rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, StateDictError
from shardkit.order import Window, remaining_after, stream_seed, uniforms

__all__ = [
    "REMAINDERS",
    "Generation",
    "PlanConfig",
    "Ranges",
    "ResampledStream",
    "epoch_sequence",
    "rank_length",
    "remaining_sequence",
    "shard_order",
    "shuffle_window",
    "split",
    "worker_lengths",
    "worker_stream",
]

REMAINDERS = ("drop", "pad")
_DRAW_BLOCK = 1024


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
        return _coalesce(
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
        return _coalesce(self.shard[i], idx, idx + 1)

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


def _coalesce(shard: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Ranges:
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


@dataclass(frozen=True)
class PlanConfig:
    """The choices that fix an epoch's order.

    Args:
        seed: the data order seed.
        shuffle_shards: shuffle the shard order every epoch (else the manifest order).
        remainder: ``"drop"`` or ``"pad"``, for samples that do not divide by world size.
        resampled: draw shards with replacement instead of reading each once.
        epoch_length: samples per rank in an epoch of resampled mode (None: endless).
    """

    seed: int = 0
    shuffle_shards: bool = True
    remainder: str = "drop"
    resampled: bool = False
    epoch_length: int | None = None

    def __post_init__(self) -> None:
        if self.remainder not in REMAINDERS:
            raise ConfigError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if self.epoch_length is not None and self.epoch_length < 0:
            raise ConfigError(f"epoch length must not be negative, got {self.epoch_length}")


@dataclass(frozen=True)
class Generation:
    """A finished part of an epoch: a run with some world size and worker count, and how
    many stream positions each of its ``(rank, worker)`` streams had emitted.

    ``positions[rank][worker]``: ranks need not be in lockstep (a filter, packing, a
    skipped shard make them consume at different rates).
    """

    world: int
    workers: int
    positions: tuple[tuple[int, ...], ...]
    bufsize: int | None = None
    initial: int | None = None

    def __post_init__(self) -> None:
        rows = self.positions
        if len(rows) != self.world or any(len(r) != self.workers for r in rows):
            raise StateDictError(
                f"generation of {self.world} ranks x {self.workers} workers needs "
                f"{self.world} rows of {self.workers} positions"
            )
        for row in rows:
            for p in row:
                if type(p) is not int or p < 0:
                    raise StateDictError(f"generation: position {p!r} must be an int >= 0")

    def position(self, rank: int, worker: int) -> int:
        return self.positions[rank][worker]

    def consumed(self) -> int:
        """Stream positions emitted by every stream of the generation together."""
        return sum(sum(row) for row in self.positions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "workers": self.workers,
            "positions": [list(row) for row in self.positions],
            "bufsize": self.bufsize,
            "initial": self.initial,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Generation:
        """Read a history entry; a flat list of positions (shardkit <= 0.1: one per worker,
        the same on every rank) is read as that list on every rank."""
        try:
            world, workers = _count(raw["world"]), _count(raw["workers"])
            rows = raw["positions"]
            if not isinstance(rows, list):
                raise TypeError("positions must be a list")
            if rows and not isinstance(rows[0], list):
                rows = [rows] * world
            bufsize, initial = raw.get("bufsize"), raw.get("initial")
            return cls(
                world,
                workers,
                tuple(tuple(row) for row in rows),
                None if bufsize is None else _count(bufsize),
                None if initial is None else _count(initial),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateDictError(f"source state: bad history entry {raw!r}: {exc}") from None

    def window(self, seed: int, epoch: int, gen: int, rank: int, worker: int) -> Window | None:
        return shuffle_window(self.bufsize, self.initial, seed, epoch, gen, rank, worker)


def _count(x: Any) -> int:
    if type(x) is not int or x < 1:
        raise ValueError(f"{x!r} is not a positive int")
    return x


def shuffle_window(
    bufsize: int | None,
    initial: int | None,
    seed: int,
    epoch: int,
    gen: int,
    rank: int,
    worker: int,
) -> Window | None:
    """The shuffle window of one worker's stream (None: no shuffle)."""
    if bufsize is None or bufsize <= 1:
        return None
    return Window(bufsize, initial or bufsize, stream_seed(seed, epoch, gen, rank, worker))


def shard_order(nshards: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The shard order of an epoch: a permutation drawn from ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(nshards, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x5A4D])))
    return rng.permutation(nshards).astype(np.int64)


def epoch_sequence(counts: Sequence[int], cfg: PlanConfig, epoch: int) -> Ranges:
    """Every sample of the data set, in this epoch's shard order."""
    c = np.asarray(counts, dtype=np.int64)
    order = shard_order(len(c), cfg.seed, epoch, cfg.shuffle_shards)
    return _coalesce(order, np.zeros(len(order), dtype=np.int64), c[order])


def rank_length(total: int, world: int, remainder: str = "drop") -> int:
    """Samples each rank gets from a sequence of ``total``."""
    if world < 1:
        raise ConfigError(f"world size must be at least 1, got {world}")
    return total // world if remainder == "drop" else -(-total // world)


def worker_lengths(per_rank: int, workers: int) -> list[int]:
    """How a rank's ``per_rank`` samples split among its workers (contiguous parts)."""
    if workers < 1:
        raise ConfigError(f"worker count must be at least 1, got {workers}")
    base, extra = divmod(per_rank, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def split(seq: Ranges, world: int, rank: int, workers: int, worker: int, remainder: str) -> Ranges:
    """The part of ``seq`` that ``(rank, worker)`` reads."""
    if not 0 <= rank < world or not 0 <= worker < workers:
        raise ConfigError(f"rank {rank}/{world} worker {worker}/{workers} is out of range")
    per = rank_length(seq.total, world, remainder)
    lengths = worker_lengths(per, workers)
    start = rank * per + sum(lengths[:worker])
    full = seq.wrap(per * world) if remainder == "pad" else seq
    return full.take(start, start + lengths[worker])


def remaining_sequence(
    counts: Sequence[int], cfg: PlanConfig, epoch: int, history: Sequence[Generation]
) -> Ranges:
    """What is left of an epoch after the generations of ``history``, in order."""
    seq = epoch_sequence(counts, cfg, epoch)
    for g, gen in enumerate(history):
        parts: list[Ranges] = []
        for rank in range(gen.world):
            for worker in range(gen.workers):
                stream = split(seq, gen.world, rank, gen.workers, worker, cfg.remainder)
                window = gen.window(cfg.seed, epoch, g, rank, worker)
                pos = gen.position(rank, worker)
                if pos > stream.total:
                    raise StateDictError(
                        f"history entry {g}: rank {rank} worker {worker} emitted {pos} of a "
                        f"stream of {stream.total}"
                    )
                scattered, tail = remaining_after(stream.total, window, pos)
                parts.append(stream.pick(scattered))
                parts.append(stream.take(tail, stream.total))
        seq = Ranges.concat(parts)
    return seq


class ResampledStream:
    """An endless (or ``length``-long) stream of whole shards drawn with replacement."""

    def __init__(self, counts: Sequence[int], seed: int, length: int | None) -> None:
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


def worker_stream(
    counts: Sequence[int],
    cfg: PlanConfig,
    epoch: int,
    world: int,
    rank: int,
    workers: int,
    worker: int,
    history: Sequence[Generation] = (),
) -> Ranges | ResampledStream:
    """The stream ``(rank, worker)`` reads in ``epoch`` after ``history``."""
    if not cfg.resampled:
        seq = remaining_sequence(counts, cfg, epoch, history)
        return split(seq, world, rank, workers, worker, cfg.remainder)
    gen = len(history)
    seed = stream_seed(cfg.seed, epoch, gen, rank, worker, 0x7E5A)
    if cfg.epoch_length is None:
        return ResampledStream(counts, seed, None)
    left = cfg.epoch_length * (history[0].world if history else world)
    for h in history:
        left -= h.consumed()
    per = rank_length(max(left, 0), world, cfg.remainder)
    return ResampledStream(counts, seed, worker_lengths(per, workers)[worker])
