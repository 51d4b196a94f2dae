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
from shardkit.stages import Context, Stage, check_state, sources_of
from shardkit.stages.base import Grid, check_int
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
        self._ctx = Context()
        self._draws = 0
        self._generation = 0
        self._exhausted = [False] * len(stages)

    def clone(self) -> Mix:
        new = copy.copy(self)
        new._pending = None
        new.stages = [s.clone() for s in self.stages]
        return new

    def children(self) -> list[Stage]:
        return list(self.stages)

    def configure(self, ctx: Context) -> None:
        self._ctx = ctx
        super().configure(ctx)

    def __iter__(self) -> Iterator[Any]:
        st = self._take_pending()
        self._draws, self._exhausted = 0, [False] * len(self.stages)
        if st is not None:
            self._draws = int(st["draws"])
            self._generation = int(st["generation"])
            self._exhausted = [bool(x) for x in st["exhausted"]]
        else:
            self._generation = 0
        return self._mix([iter(s) for s in self.stages])

    def _choices(self, first: int) -> np.ndarray:
        """Uniforms for draws ``first ..``: draw ``t`` depends on ``t`` only (resumable)."""
        ctx = self._ctx
        seed = stream_seed(self.seed, ctx.epoch, self._generation, ctx.rank, ctx.worker, 0x313)
        return uniforms(seed, np.arange(first, first + _BLOCK, dtype=np.int64))

    def _mix(self, its: list[Iterator[Any]]) -> Iterator[Any]:
        n = len(its)
        if not self.longest and any(self._exhausted):  # resumed after the mixture ended
            return
        while not all(self._exhausted):
            weights = [
                0.0 if gone else float(w)
                for gone, w in zip(self._exhausted, self.weights, strict=True)
            ]
            total = sum(weights)
            if total <= 0:
                return
            cum = list(itertools.accumulate(weights))
            active = True
            while active:  # until a data set runs out and the weights change
                for u in self._choices(self._draws).tolist():
                    c = min(bisect.bisect_right(cum, u * total), n - 1)
                    self._draws += 1
                    item = next(its[c], _END)
                    if item is _END:
                        self._exhausted[c] = True
                        if not self.longest:
                            return
                        active = False
                        break
                    yield item

    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        return {
            "stage": self.name,
            "version": self.version,
            "draws": self._draws,
            "generation": self._generation,
            "exhausted": list(self._exhausted),
            "sources": [s.state_dict() for s in self.stages],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        st = check_state(
            state, self.name, self.version, ("draws", "generation", "exhausted", "sources")
        )
        check_int(st, self.name, "draws")
        check_int(st, self.name, "generation")
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
        for stage, sub in zip(self.stages, subs, strict=True):
            if sub is None:  # a merged state of a source nothing was read from
                stage.clear_state()
            else:
                stage.load_state_dict(sub)
        self._pending = st

    def params(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(), "seed": self.seed, "longest": self.longest}

    def spec(self) -> list[Any]:
        return [{"stage": self.name, **self.params(), "sources": [s.spec() for s in self.stages]}]

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

    def state_epoch(self, state: Mapping[str, Any]) -> int:
        for stage, sub in zip(self.stages, state["sources"], strict=True):
            if sub is not None:
                return stage.state_epoch(sub)
        raise StateDictError("mix: the state holds no source state")

    def lengths(self, ctx: Context) -> list[int] | None:
        if not self.longest:
            return None
        total: list[int] | None = None
        for s in self.stages:
            sub = s.lengths(ctx)
            if sub is None:
                return None
            total = sub if total is None else [a + b for a, b in zip(total, sub, strict=True)]
        return total


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
        if d._grouped:
            raise ConfigError("mix samples, not batches: call batched()/pack_tokens() after mix()")
    stage = Mix([d.pipeline().clone() for d in datasets], weights, seed=seed, longest=longest)
    sources = sources_of(stage)
    out = ShardDataset._from_stage(stage, sources, handler=datasets[0]._handler, seed=seed)
    out._world_given = datasets[0]._world_given
    return out
