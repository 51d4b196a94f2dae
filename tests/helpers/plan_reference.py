"""The plan as it was before it was vectorised (one ``split`` per stream): the reference
the property tests hold :func:`shardkit.plan.assign.remaining_sequence` to."""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.errors import StateDictError
from shardkit.plan.assign import PlanConfig, epoch_sequence, split
from shardkit.plan.generation import Generation
from shardkit.plan.order import remaining_after
from shardkit.plan.ranges import Ranges


def reference_remaining(
    counts: Sequence[int], cfg: PlanConfig, epoch: int, history: Sequence[Generation]
) -> Ranges:
    """What is left of an epoch after ``history``: every stream cut from the whole."""
    seq = epoch_sequence(counts, cfg, epoch)
    for g, gen in enumerate(history):
        parts: list[Ranges] = []
        for rank in range(gen.world):
            for worker in range(gen.workers):
                stream = split(seq, gen.world, rank, gen.workers, worker, cfg.remainder)
                window = gen.window(cfg.seed, epoch, g, rank, worker)
                pos = gen.position(rank, worker)
                if pos > stream.total:
                    raise StateDictError(f"history entry {g}: {pos} of {stream.total}")
                scattered, tail = remaining_after(stream.total, window, pos)
                parts.append(stream.pick(scattered))
                parts.append(stream.take(tail, stream.total))
        seq = Ranges.concat(parts)
    return seq
