"""Mix: a seeded, resumable mixture of several pipelines, weighted by a schedule.

Every item is one draw: which source gives it is :func:`shardkit.plan.schedule.choose` of
a counter-based uniform (seeded by ``(seed, epoch, generation, rank, worker)``, under
``"never"`` the epoch the draws began in; draw ``t`` a pure function of ``t``) and the
schedule's weights at the job's progress. The progress is the samples (or tokens) the
whole job drew: a worker counts its own and scales them by ``world * workers`` (the
workers of every rank draw at the same rate, as the loader takes their batches in turn),
plus what earlier generations drew; so it is the same on every rank and for any worker
count, up to a batch per worker.

``stop``: ``"first"`` ends the mixture when a source runs out (WebDataset's
``RandomMix``); ``"longest"`` goes on with the others, re-weighted, until all ran out;
``"never"`` starts a source that ran out on its own next epoch (its own epoch counter: its
own shuffle and split), so the mixture never ends (``with_epoch`` makes nominal epochs).

State: the draw counter, the generation, the progress, each source's cursor, own epoch and
whether it ran out, and the exposure (samples and tokens each source gave this worker).
An elastic merge folds every ``(rank, worker)``: each source merged on its own (under
``"never"`` at the latest of its epochs in the grid: the rest of an older epoch a worker
was reading is left out, nothing is read twice), the progress summed, a new generation; the
summed exposure goes to rank 0's worker 0, so the job's totals stay exact.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.schedule import Schedule
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Grid, Stage, check_int, check_state
from shardkit.stages.mix_draws import MixCursor
from shardkit.stages.source import sources_of

__all__ = ["STOPS", "Mix", "find_mix", "given_in", "mix_state", "reweighted"]

STOPS = ("first", "longest", "never")
_KEYS = ("epoch", "generation", "draws", "taken", "base", "exhausted", "epochs", "counts")


def find_mix(stage: Stage | None) -> Mix | None:
    """The mixture a pipeline ending in ``stage`` reads from (None: none)."""
    while stage is not None:
        if isinstance(stage, Mix):
            return stage
        stage = stage.upstream
    return None


def mix_state(state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The mixture's state inside a pipeline state (found down the ``"source"`` nesting)."""
    while isinstance(state, Mapping):
        if state.get("stage") == Mix.name:
            return state
        state = state.get("source")
    return None


def given_in(state: Mapping[str, Any] | None, n: int) -> list[list[int]]:
    """Per source ``[samples, tokens]`` a stage above the mixture delivered of what its
    state still holds back (``"given"``: a packer's document or group being cut, whose
    state is the one before it), summed down the ``"source"`` nesting."""
    out = [[0, 0] for _ in range(n)]
    while isinstance(state, Mapping) and state.get("stage") != Mix.name:
        for entry in state.get("given") or ():
            if isinstance(entry, list) and len(entry) == 3 and 0 <= entry[0] < n:
                out[entry[0]][0] += int(entry[1])
                out[entry[0]][1] += int(entry[2])
        state = state.get("source")
    return out


def reweighted(fingerprint: Any) -> Any:
    """A pipeline fingerprint without its mixtures' weights, their sources in name order:
    what a state loaded with ``reweight=True`` must match."""
    if isinstance(fingerprint, list):
        return [reweighted(x) for x in fingerprint]
    if not isinstance(fingerprint, Mapping):
        return fingerprint
    out = {k: reweighted(v) for k, v in fingerprint.items() if k != "schedule"}
    if out.get("stage") == Mix.name and isinstance(out.get("names"), list):
        pairs = sorted(zip(out["names"], out.get("sources", []), strict=False))
        out["names"] = [n for n, _ in pairs]
        out["sources"] = [s for _, s in pairs]
    return out


class Mix(Stage):
    """Interleave ``stages`` by seeded draws weighted by ``schedule``.

    Args:
        stages: the pipelines to mix (each ends in per-sample items).
        schedule: the weights over the job's progress (bound to ``names``).
        names: one name per source (exposure, weights by name, reweighting).
        seed: the draw seed.
        stop: ``"first"``, ``"longest"`` or ``"never"`` (see the module docstring).
        tokens_field: a field whose length counts a sample's tokens (exposure, schedules
            in tokens); None: not counted.
    """

    name = "mix"
    version = 2

    def __init__(
        self,
        stages: Sequence[Stage],
        schedule: Schedule,
        *,
        names: Sequence[str],
        seed: int = 0,
        stop: str = "first",
        tokens_field: str | None = None,
    ) -> None:
        super().__init__(None)
        if not stages:
            raise ConfigError("mix needs at least one data set")
        if stop not in STOPS:
            raise ConfigError(f"mix: stop must be one of {STOPS}, got {stop!r}")
        if len(names) != len(stages) or len(set(names)) != len(names):
            raise ConfigError(f"mix: need one distinct name per data set, got {list(names)}")
        self.stages = list(stages)
        self.names = [str(n) for n in names]
        self.schedule = schedule.bind(self.names)
        self.seed = seed
        self.stop = stop
        self.tokens_field = tokens_field

    def children(self) -> list[Stage]:
        return list(self.stages)

    def over(self, children: Sequence[Stage]) -> Mix:
        new = copy.copy(self)
        new.stages = list(children)
        return new

    def counting(self, tokens_field: str) -> Mix:
        """This mixture counting its sources' tokens by ``tokens_field`` (a new one)."""
        return Mix(
            self.stages,
            self.schedule,
            names=self.names,
            seed=self.seed,
            stop=self.stop,
            tokens_field=tokens_field,
        )

    def clone(self) -> Mix:
        new = copy.copy(self)
        new.stages = [s.clone() for s in self.stages]
        return new

    def params(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "schedule": self.schedule.params(),
            "seed": self.seed,
            "stop": self.stop,
            "tokens_field": self.tokens_field,
            "sources": [s.spec() for s in self.stages],
        }

    # -- iteration -----------------------------------------------------------------
    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if self.schedule.unit == "tokens" and self.tokens_field is None:
            raise ConfigError(
                "mix: a schedule in tokens needs the token field: give tokens_field= (or "
                "call pack_tokens() on the mixture)"
            )
        if state is None:
            st = self.fresh(ctx)
        else:
            st = self.check(state)
            if st["epoch"] != ctx.epoch:
                raise StateDictError(
                    f"mix: the state is for epoch {st['epoch']}, this iteration epoch {ctx.epoch}"
                )
        if st.pop("shared", False) and (ctx.rank, ctx.worker) != (0, 0):
            st["counts"] = [[0, 0] for _ in self.stages]  # the merged totals are rank 0's
        return MixCursor(self, ctx, st)

    def fresh(self, ctx: Context) -> dict[str, Any]:
        """The state a first epoch starts from."""
        n = len(self.stages)
        return {
            "stage": self.name,
            "version": self.version,
            "names": list(self.names),
            "epoch": ctx.epoch,
            "generation": 0,
            "draws": 0,
            "taken": [0, 0],
            "base": [0, 0],
            "exhausted": [False] * n,
            "epochs": [ctx.epoch] * n,
            "origin": ctx.epoch,
            "counts": [[0, 0] for _ in range(n)],
            "sources": [None] * n,
        }

    def check(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` checked (shape, types, one entry per source) and put in this mixture's
        source order (a state of the same sources by name in another order fits); a deep
        copy: the cursor changes its lists, never the caller's (a state loaded twice)."""
        st = check_state(state, self.name, self.version, (*_KEYS, "names", "sources"))
        st = copy.deepcopy(st)
        for key in ("epoch", "generation", "draws"):
            check_int(st, self.name, key)
        if "origin" in st:
            check_int(st, self.name, "origin")
        n = len(self.stages)
        names = st["names"]
        if not isinstance(names, list) or sorted(names) != sorted(self.names):
            raise StateDictError(f"mix: the state's sources are {names!r}, here {self.names}")
        order = [names.index(name) for name in self.names]
        for key in ("exhausted", "epochs", "counts", "sources"):
            if not isinstance(st[key], list) or len(st[key]) != n:
                raise StateDictError(f"mix: key {key!r} needs one entry per source ({n})")
            st[key] = [st[key][i] for i in order]
        st["names"] = list(self.names)
        pairs = [st["taken"], st["base"], *st["counts"]]
        if not all(
            isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p)
            for p in pairs
        ):
            raise StateDictError("mix: 'taken', 'base' and 'counts' hold [samples, tokens] ints")
        if not all(isinstance(f, bool) for f in st["exhausted"]):
            raise StateDictError("mix: key 'exhausted' must hold true/false flags")
        if not all(type(e) is int and e >= 0 for e in st["epochs"]):
            raise StateDictError("mix: key 'epochs' must hold ints >= 0")
        return st

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        """The state epoch ``epoch`` starts from after an epoch ended at ``state``: the
        exposure and progress go on; under ``"never"`` every source also keeps its cursor
        and own epoch (the epochs are nominal), else the sources start epoch ``epoch``."""
        if state is None:
            return None
        st = self.check(state)
        st["epoch"] = epoch
        if self.stop == "never":
            return st
        scale = st.pop("scale", 1)
        taken = st["taken"]
        st["base"] = [b + t * scale for b, t in zip(st["base"], taken, strict=True)]
        n = len(self.stages)
        st.update(draws=0, taken=[0, 0], exhausted=[False] * n, epochs=[epoch] * n)
        st["sources"] = [None] * n
        return st

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Each source merged on its own (at its latest epoch), the progress and exposure
        summed; a new draw sequence (a new generation)."""
        found = [self.check(st) for row in grid for st in row if st is not None]
        if not found:
            return None
        n = len(self.stages)
        epochs = [max(int(st["epochs"][k]) for st in found) for k in range(n)]
        subs = []
        for k, stage in enumerate(self.stages):
            sub = [
                [
                    None
                    if st is None or self.check(st)["epochs"][k] != epochs[k]
                    else self.check(st)["sources"][k]
                    for st in row
                ]
                for row in grid
            ]
            subs.append(stage.merge(sub))
        total = [sum(st["taken"][i] for st in found) for i in (0, 1)]
        # a worker that gave nothing since a merge holds its totals: counted at (0, 0) only
        counts = [
            self.check(st)["counts"]
            for r, row in enumerate(grid)
            for w, st in enumerate(row)
            if st is not None and not (st.get("shared") and (r, w) != (0, 0))
        ]
        first = found[0]
        return {
            **first,
            "generation": max(int(st["generation"]) for st in found) + 1,
            "draws": 0,
            "taken": [0, 0],
            "base": [first["base"][i] + total[i] for i in (0, 1)],
            # a source one worker's share of ran out may hold more in the others': the new
            # workers draw from what is left of each (as before the merge, per worker)
            "exhausted": [False] * n,
            "epochs": epochs,
            "counts": [[sum(c[k][i] for c in counts) for i in (0, 1)] for k in range(n)],
            "shared": True,
            "sources": subs,
        }

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        """Under ``"longest"`` what every source has still to give (each in its own epoch);
        else None (under ``"first"`` the rest of the others is left by design, under
        ``"never"`` nothing ends)."""
        if self.stop != "longest":
            return None
        st = None if state is None else self.check(state)
        total = 0
        for k, stage in enumerate(self.stages):
            epoch = ctx.epoch if st is None else int(st["epochs"][k])
            sub = None if st is None else st["sources"][k]
            where = Context(ctx.rank, ctx.world, ctx.worker, ctx.workers, epoch)
            n = stage.left(where, sub)
            if n is None:
                return None
            total += n
        return total

    def endless(self) -> int | None:
        """Under ``"never"`` (or over an endless source) the mixture never ends: one pass is
        every source's samples."""
        ends = [s.endless() for s in self.stages]
        if self.stop != "never" and all(e is None for e in ends):
            return None
        return sum(src.catalog().total for src in sources_of(self))

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        if self.stop != "longest":
            return None
        found = None if state is None else mix_state(state)
        subs = [None] * len(self.stages) if found is None else list(found["sources"])
        total: list[int] | None = None
        for s, sub_state in zip(self.stages, subs, strict=True):
            sub = s.lengths(ctx, sub_state)
            if sub is None:
                return None
            total = sub if total is None else [a + b for a, b in zip(total, sub, strict=True)]
        return total

    # -- exposure ------------------------------------------------------------------
    def exposure(
        self, states: Sequence[Mapping[str, Any] | None], where: Context
    ) -> dict[str, dict[str, float | int]]:
        """Per source name: ``samples``, ``tokens`` and ``epochs`` of the worker states
        ``states`` (one process's or one rank's), ``share`` (realized fraction of the
        samples) and ``weight`` (scheduled now, at the job's progress)."""
        mixes = []
        n = len(self.stages)
        for w, state in enumerate(states):
            found = mix_state(state)
            if found is None:
                continue
            m = self.check(found)
            if m.get("shared") and (where.rank, w) != (0, 0):  # the merged totals: rank 0's
                m["counts"] = [[0, 0] for _ in self.stages]
            for k, (s, t) in enumerate(given_in(state, n)):  # counted at delivery
                m["counts"][k] = [m["counts"][k][0] + s, m["counts"][k][1] + t]
            mixes.append(m)
        samples = [sum(m["counts"][k][0] for m in mixes) for k in range(n)]
        tokens = [sum(m["counts"][k][1] for m in mixes) for k in range(n)]
        epochs = [max((int(m["epochs"][k]) for m in mixes), default=0) for k in range(n)]
        scale = where.world * where.workers
        unit = 1 if self.schedule.unit == "tokens" else 0
        progress = max((m["base"][unit] + m["taken"][unit] * scale for m in mixes), default=0)
        weights = self.schedule.weights_at(progress)
        total = sum(samples)
        return {
            name: {
                "samples": samples[k],
                "tokens": tokens[k],
                "epochs": epochs[k],
                "share": samples[k] / total if total else 0.0,
                "weight": weights[k],
            }
            for k, name in enumerate(self.names)
        }
