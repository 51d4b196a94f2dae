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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.generation import Generation
from shardkit.plan.order import remaining_after_many, stream_seed
from shardkit.plan.ranges import Ranges, coalesce, take_many
from shardkit.plan.resampled import ResampledStream
from shardkit.plan.world import Context

__all__ = [
    "REMAINDERS",
    "PlanConfig",
    "epoch_sequence",
    "rank_length",
    "remaining_sequence",
    "replan_dropped",
    "shard_order",
    "split",
    "stream_lengths",
    "worker_lengths",
    "worker_stream",
]

Counts = Sequence[int] | np.ndarray  # samples per shard, in manifest order
REMAINDERS = ("drop", "pad")


@dataclass(frozen=True)
class PlanConfig:
    """The choices that fix an epoch's order.

    Args:
        seed: the data order seed.
        shuffle_shards: shuffle the shard order every epoch (else the manifest order).
        remainder: ``"drop"`` or ``"pad"``, for samples that do not divide by world size.
        resampled: draw shards with replacement instead of reading each once.
        epoch_length: samples per rank in an epoch of resampled mode (None: endless).
        bufsize: the sample shuffle's window (:mod:`shardkit.plan.order`; None: none).
        initial: the window's size at the epoch's start (None: none).
        by_node: every rank reads its own share (else each reads all, as rank 0 of 1).
    """

    seed: int = 0
    shuffle_shards: bool = True
    remainder: str = "drop"
    resampled: bool = False
    epoch_length: int | None = None
    bufsize: int | None = None
    initial: int | None = None
    by_node: bool = False

    def __post_init__(self) -> None:
        if self.remainder not in REMAINDERS:
            raise ConfigError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if self.epoch_length is not None and self.epoch_length < 0:
            raise ConfigError(f"epoch length must not be negative, got {self.epoch_length}")


def shard_order(nshards: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The shard order of an epoch: a permutation drawn from ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(nshards, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x5A4D])))
    return rng.permutation(nshards).astype(np.int64)


def epoch_sequence(counts: Counts, cfg: PlanConfig, epoch: int) -> Ranges:
    """Every sample of the data set, in this epoch's shard order."""
    c = np.asarray(counts, dtype=np.int64)
    order = shard_order(len(c), cfg.seed, epoch, cfg.shuffle_shards)
    return coalesce(order, np.zeros(len(order), dtype=np.int64), c[order])


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


@dataclass(frozen=True)
class _Cut:
    """How a generation cut the sequence it read (of ``total`` samples, wrapped for
    ``"pad"``): every stream's start, length and emitted count, rank-major."""

    g: int
    gen: Generation
    total: int
    starts: np.ndarray
    lengths: np.ndarray
    emitted: np.ndarray

    @property
    def left(self) -> np.ndarray:
        out: np.ndarray = self.lengths - self.emitted
        return out


def _cuts(total: int, remainder: str, history: Sequence[Generation]) -> tuple[list[_Cut], int]:
    """The cut of every generation and how many samples the last one left:
    ``O(ranks x workers)`` each, nothing per shard."""
    cuts = []
    for g, gen in enumerate(history):
        per = rank_length(total, gen.world, remainder)
        lengths = np.asarray(worker_lengths(per, gen.workers), dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        starts = (np.arange(gen.world, dtype=np.int64)[:, None] * per + offsets).ravel()
        lengths = np.tile(lengths, gen.world)
        emitted = np.asarray(gen.positions, dtype=np.int64).reshape(-1)
        over = np.flatnonzero(emitted > lengths)
        if len(over):
            k = int(over[0])
            raise StateDictError(
                f"history entry {g}: rank {k // gen.workers} worker {k % gen.workers} emitted "
                f"{int(emitted[k])} of a stream of {int(lengths[k])}"
            )
        cuts.append(_Cut(g, gen, total, starts, lengths, emitted))
        total = int((lengths - emitted).sum())
    return cuts, total


def _expand(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(part, first[part] + j)`` for ``j < count[part]``, every part in turn."""
    part = np.repeat(np.arange(len(first)), count)
    heads = np.concatenate(([0], np.cumsum(count)[:-1]))
    return part, first[part] + np.arange(len(part)) - heads[part]


def _unwrap(a: np.ndarray, b: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of a sequence repeated from its start, as intervals of the sequence."""
    if total == 0:
        return a[:0], b[:0]
    q1, q2 = a // total, (b - 1) // total
    part, q = _expand(q1, q2 - q1 + 1)
    base = q * total
    return np.maximum(a[part], base) - base, np.minimum(b[part], base + total) - base


def _down(cut: _Cut, cfg: PlanConfig, epoch: int, a: np.ndarray, b: np.ndarray) -> Ranges:
    """Intervals of what ``cut`` left, as intervals of the sequence it cut (only the
    streams they touch look at their shuffle window). Returned as ``Ranges`` rows
    ``(0, start, stop)`` in order."""
    keep = b > a
    a, b = a[keep], b[keep]
    left = cut.left
    cum = np.cumsum(left)
    first = cum - left
    k1 = np.searchsorted(cum, a, side="right")
    k2 = np.searchsorted(cum, b - 1, side="right")
    piece, k = _expand(k1, k2 - k1 + 1)
    lo = np.maximum(a[piece], first[k]) - first[k]
    hi = np.minimum(b[piece], cum[k]) - first[k]
    window = cut.gen.window(cfg.seed, epoch, cut.g, 0, 0)
    if window is None:  # what a stream left is its tail
        base = cut.starts[k] + cut.emitted[k]
        return Ranges(np.zeros(len(k), dtype=np.int64), base + lo, base + hi)
    touched = np.unique(k)
    workers = cut.gen.workers
    seeds = np.array(
        [stream_seed(cfg.seed, epoch, cut.g, t // workers, t % workers) for t in touched.tolist()],
        dtype=np.uint64,
    )
    which, scattered, tails = remaining_after_many(
        cut.lengths[touched], cut.emitted[touched], window.bufsize, window.initial, seeds
    )
    t = np.searchsorted(touched, k)  # each piece's stream among the touched
    s_first = np.searchsorted(which, t, side="left")
    s_count = np.searchsorted(which, t, side="right") - s_first
    # a stream's remaining list: its scattered positions, then its tail
    n_single = np.clip(np.minimum(hi, s_count) - lo, 0, None)
    sp, si = _expand(s_first + np.minimum(lo, s_count), n_single)
    single = cut.starts[k[sp]] + scattered[si]
    t_lo = tails[t] + np.maximum(lo - s_count, 0)
    t_hi = tails[t] + hi - s_count
    order = np.argsort(np.concatenate((sp, np.arange(len(k)))), kind="stable")
    starts = np.concatenate((single, cut.starts[k] + t_lo))[order]
    stops = np.concatenate((single + 1, cut.starts[k] + np.maximum(t_hi, t_lo)))[order]
    return Ranges(np.zeros(len(starts), dtype=np.int64), starts, stops)


def _resolve(
    counts: Counts,
    cfg: PlanConfig,
    epoch: int,
    history: Sequence[Generation],
    part: Context | None,
) -> Ranges:
    """Stream ``part`` (its rank and worker) of what ``history`` left of the
    epoch (None: all of it), mapped down generation by generation to the epoch's order.
    ``O(shards + ranks x workers)`` per generation; only the streams the part touches
    look at their shuffle window."""
    seq = epoch_sequence(counts, cfg, epoch)
    cuts, total = _cuts(seq.total, cfg.remainder, history)
    a = np.array([0], dtype=np.int64)
    b = np.array([total], dtype=np.int64)
    if part is not None:
        per = rank_length(total, part.world, cfg.remainder)
        lengths = worker_lengths(per, part.workers)
        a[0] = part.rank * per + sum(lengths[: part.worker])
        b[0] = a[0] + lengths[part.worker]
        if cfg.remainder == "pad":
            a, b = _unwrap(a, b, total)
    for cut in reversed(cuts):
        r = _down(cut, cfg, epoch, a, b)
        a, b = r.lo, r.hi
        if cfg.remainder == "pad":
            a, b = _unwrap(a, b, cut.total)
    return take_many(seq, a, b)


def remaining_sequence(
    counts: Counts, cfg: PlanConfig, epoch: int, history: Sequence[Generation]
) -> Ranges:
    """What is left of an epoch after the generations of ``history``, in order."""
    return _resolve(counts, cfg, epoch, history, None)


def worker_stream(
    counts: Counts, cfg: PlanConfig, ctx: Context, history: Sequence[Generation] = ()
) -> Ranges | ResampledStream:
    """The stream ``ctx``'s rank and worker read in ``ctx.epoch`` after ``history``."""
    if not cfg.resampled:
        return _resolve(counts, cfg, ctx.epoch, history, ctx)
    seed = stream_seed(cfg.seed, ctx.epoch, len(history), ctx.rank, ctx.worker, 0x7E5A)
    if cfg.epoch_length is None:
        return ResampledStream(counts, seed, None)
    lengths = stream_lengths(0, cfg, ctx.world, ctx.workers, history)
    assert lengths is not None
    return ResampledStream(counts, seed, lengths[ctx.worker])


def stream_lengths(
    total: int, cfg: PlanConfig, world: int, workers: int, history: Sequence[Generation] = ()
) -> list[int] | None:
    """How long each worker's stream is on every rank (None: endless), from the number of
    samples alone: ``O(ranks x workers)`` per generation, no shard order drawn."""
    left = _left(total, cfg, world, history)
    if left is None:
        return None
    return worker_lengths(rank_length(left, world, cfg.remainder), workers)


def replan_dropped(
    total: int, cfg: PlanConfig, world: int, history: Sequence[Generation] = ()
) -> int:
    """Samples an elastic resume's re-plan leaves out: what ``history`` left of the epoch
    does not divide by the new ``world`` with ``remainder="drop"`` (0 for a fresh epoch,
    whose remainder is never any rank's share, and for ``"pad"``)."""
    left = _left(total, cfg, world, history) if history and cfg.remainder == "drop" else None
    return 0 if left is None else left - rank_length(left, world, cfg.remainder) * world


def _left(total: int, cfg: PlanConfig, world: int, history: Sequence[Generation]) -> int | None:
    """The samples of the epoch that ``history`` left to the next generation (None:
    endless)."""
    if cfg.resampled:
        if cfg.epoch_length is None:
            return None
        left = cfg.epoch_length * (history[0].world if history else world)
        for h in history:
            left -= h.consumed()
        return max(left, 0)
    return _cuts(total, cfg.remainder, history)[1]
