"""mix: a seeded, resumable weighted mixture of several shard sets.

(The module is ``mixing``, not ``mix``: a submodule named like the function would shadow
``shardkit.mix`` once imported.)

``mix([ds_a, ds_b], weights=[0.7, 0.3])`` draws, for every item, which data set it comes
from, with a counter-based generator seeded by ``(seed, epoch, generation, rank,
worker)``: draw ``t`` is a pure function of ``t``, so the state is the draw count plus each
data set's own cursor. By default the mixture ends when any data set runs out (as
WebDataset's ``RandomMix``); ``longest=True`` goes on with the others, re-weighted.
"""

from __future__ import annotations

import bisect
import copy
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.order import stream_seed, uniforms
from shardkit.stages import Context, Stage, check_state
from shardkit.stages.base import Cursor, Grid, check_int
from shardkit.streaming.dataset import ShardDataset

__all__ = ["Mix", "mix"]

_BLOCK = 1024
_END = object()


class Mix(Stage):
    """Interleave ``stages`` by seeded weighted draws.

    Args:
        stages: the pipelines to mix (each ends in per-sample items).
        weights: relative weights (default: equal).
        seed: the draw seed.
        longest: go on until every pipeline is exhausted (else stop at the first).
    """

    name = "mix"
    version = 1

    def __init__(
        self,
        stages: Sequence[Stage],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        longest: bool = False,
    ) -> None:
        super().__init__(None)
        if not stages:
            raise ConfigError("mix needs at least one data set")
        w = np.ones(len(stages)) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(stages),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ConfigError(f"mix: need one non-negative weight per data set, got {weights!r}")
        self.stages = list(stages)
        self.weights = w / w.sum()
        self.seed = seed
        self.longest = longest

    def children(self) -> list[Stage]:
        return list(self.stages)

    def clone(self) -> Mix:
        new = copy.copy(self)
        new.stages = [s.clone() for s in self.stages]
        return new

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if state is None:
            return _MixCursor(self, ctx, [s.iterate(ctx) for s in self.stages])
        st = check_state(
            state, self.name, self.version, ("draws", "generation", "exhausted", "sources")
        )
        draws = check_int(st, self.name, "draws")
        generation = check_int(st, self.name, "generation")
        subs = st["sources"]
        if not isinstance(subs, list) or len(subs) != len(self.stages):
            raise StateDictError(
                f"mix: the state has {len(subs) if isinstance(subs, list) else '?'} sources, "
                f"this mixture {len(self.stages)}"
            )
        flags = st["exhausted"]
        if not isinstance(flags, list) or len(flags) != len(self.stages):
            raise StateDictError("mix: key 'exhausted' needs one flag per source")
        if not all(isinstance(f, bool) for f in flags):
            raise StateDictError("mix: key 'exhausted' must hold true/false flags")
        # a source nothing was read from in a merged state (None) starts fresh
        ups = [s.iterate(ctx, sub) for s, sub in zip(self.stages, subs, strict=True)]
        return _MixCursor(self, ctx, ups, draws, generation, list(flags))

    def params(self) -> dict[str, Any]:
        return {
            "weights": self.weights.tolist(),
            "seed": self.seed,
            "longest": self.longest,
            "sources": [s.spec() for s in self.stages],
        }

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Each source merged on its own; a new draw sequence (a new generation)."""
        subs = [
            s.merge([[None if st is None else st["sources"][i] for st in row] for row in grid])
            for i, s in enumerate(self.stages)
        ]
        found = [st for row in grid for st in row if st is not None]
        if not found or all(sub is None for sub in subs):
            return None
        return {
            "stage": self.name,
            "version": self.version,
            "draws": 0,
            "generation": max(int(st["generation"]) for st in found) + 1,
            "exhausted": [False] * len(self.stages),
            "sources": subs,
        }

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        if not self.longest:
            return None
        subs = [None] * len(self.stages) if state is None else state["sources"]
        total: list[int] | None = None
        for s, sub_state in zip(self.stages, subs, strict=True):
            sub = s.lengths(ctx, sub_state)
            if sub is None:
                return None
            total = sub if total is None else [a + b for a, b in zip(total, sub, strict=True)]
        return total


class _MixCursor(Cursor):
    """Draws which upstream cursor gives the next item; its state is the draw count, the
    generation and which upstreams ran out, with each upstream's own state."""

    def __init__(
        self,
        stage: Mix,
        ctx: Context,
        ups: list[Cursor],
        draws: int = 0,
        generation: int = 0,
        exhausted: list[bool] | None = None,
    ) -> None:
        super().__init__(*ups)
        self.stage = stage
        self.ctx = ctx
        self.draws = draws
        self.generation = generation
        self.exhausted = exhausted or [False] * len(ups)
        self.items = self._mix()

    def state(self) -> dict[str, Any]:
        return {
            "stage": self.stage.name,
            "version": self.stage.version,
            "draws": self.draws,
            "generation": self.generation,
            "exhausted": list(self.exhausted),
            "sources": [up.state() for up in self.upstreams],
        }

    def _choices(self, first: int) -> np.ndarray:
        """Uniforms for draws ``first ..``: draw ``t`` depends on ``t`` only (resumable)."""
        ctx = self.ctx
        seed = stream_seed(self.stage.seed, ctx.epoch, self.generation, ctx.rank, ctx.worker, 0x313)
        return uniforms(seed, np.arange(first, first + _BLOCK, dtype=np.int64))

    def _mix(self) -> Iterator[Any]:
        its, n, longest = self.upstreams, len(self.upstreams), self.stage.longest
        if not longest and any(self.exhausted):  # resumed after the mixture ended
            return
        while not all(self.exhausted):
            weights = [
                0.0 if gone else float(w)
                for gone, w in zip(self.exhausted, self.stage.weights, strict=True)
            ]
            total = sum(weights)
            if total <= 0:
                return
            cum = list(itertools.accumulate(weights))
            active = True
            while active:  # until a data set runs out and the weights change
                for u in self._choices(self.draws).tolist():
                    c = min(bisect.bisect_right(cum, u * total), n - 1)
                    self.draws += 1
                    item = next(its[c], _END)
                    if item is _END:
                        self.exhausted[c] = True
                        if not longest:
                            return
                        active = False
                        break
                    yield item


def mix(
    datasets: Sequence[ShardDataset],
    weights: Sequence[float] | None = None,
    *,
    seed: int = 0,
    longest: bool = False,
) -> ShardDataset:
    """A data set drawing from ``datasets`` with ``weights`` (seeded and resumable).

    Configure each data set's source (``split_by_node``, ``shuffle``, ``decode``...) before
    mixing; the result takes ``batched``, ``map``, ``pack_tokens`` and a loader.
    """
    if not datasets:
        raise ConfigError("mix needs at least one data set")
    for d in datasets:
        if not isinstance(d, ShardDataset):
            raise ConfigError(f"mix takes ShardDatasets, not {type(d).__name__}")
        if d.grouped:
            raise ConfigError("mix samples, not batches: call batched()/pack_tokens() after mix()")
    stage = Mix([d.pipeline().clone() for d in datasets], weights, seed=seed, longest=longest)
    return ShardDataset.over(stage, datasets[0], seed=seed)
