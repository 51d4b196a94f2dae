"""Elastic resume: fold the per-worker states of an old run into one state to re-plan from.

The old run's workers each left a cursor; together (and with the world size, since ranks
run in lockstep) they say exactly which samples of the epoch were consumed. A source's
merged state records that as one more :class:`~shardkit.plan.Generation` in its history
and starts a new generation at position 0; every new rank and worker loads the same
merged state and reads its share of what is left. Stages holding partial data reset their
own cursor (``pack_tokens`` re-reads the document it was cutting; ``mix`` starts a new
draw sequence).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import StateDictError
from shardkit.plan import Generation

__all__ = ["ResumePlan", "elastic_merge", "resume_plan"]

log = logging.getLogger("shardkit.stages")
_RESET: dict[str, dict[str, Any]] = {"pack_tokens": {"skip": 0}, "mix": {"draws": 0}}


def elastic_merge(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the states of every worker of one rank (in logical worker order)."""
    if not states:
        raise StateDictError("elastic resume: no worker states to merge")
    first = states[0]
    stage = first.get("stage")
    if stage == "shards":
        return _merge_source(states)
    out = dict(first)
    if "sources" in first:
        n = len(first["sources"])
        if any(len(s.get("sources", ())) != n for s in states):
            raise StateDictError(f"{stage}: worker states differ in their number of sources")
        out["sources"] = [elastic_merge([s["sources"][i] for s in states]) for i in range(n)]
    if "source" in first:
        out["source"] = elastic_merge([s["source"] for s in states])
    out.update(_RESET.get(str(stage), {}))
    if stage == "mix":
        out["generation"] = int(first.get("generation", 0)) + 1
        out["exhausted"] = [False] * len(out.get("sources", ()))
    return out


def _merge_source(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    first = states[0]
    workers = int(first["workers"])
    if first.get("world") is None:  # already merged and not started since: nothing to add
        return dict(first)
    used = list(states[:workers]) if workers == 1 else list(states)
    if len(used) != workers:
        raise StateDictError(
            f"shards: the state is from {workers} workers but {len(used)} worker states came"
        )
    for w, st in enumerate(used):
        same = all(st.get(k) == first.get(k) for k in ("epoch", "seed", "world", "history"))
        if not same or st.get("worker") != w:
            raise StateDictError(
                f"shards: worker state {w} does not belong with the others "
                f"(epoch/seed/world/history/worker differ)"
            )
    bufsize, initial = [*(first.get("shuffle") or ()), None, None][:2]
    gen = Generation(
        world=int(first["world"]),
        workers=workers,
        positions=tuple(int(st["position"]) for st in used),
        bufsize=bufsize,
        initial=initial,
    )
    out = dict(first)
    out.update(
        history=[*first["history"], gen.to_dict()],
        position=0,
        last=-1,
        world=None,
        workers=None,
        rank=None,
        worker=None,
    )
    return out


@dataclass(frozen=True)
class ResumePlan:
    """How a loader's iteration starts: the worker rotation, the worker states to load
    (None: fresh; one per logical worker; or one merged state for all) and the count of
    batches already delivered."""

    rotation: int = 0
    states: list[dict[str, Any]] | None = None
    initial: list[dict[str, Any]] | None = None
    batches: int = 0


def resume_plan(
    state: Mapping[str, Any] | None, *, epoch: int, workers: int, world: int, split_world: bool
) -> ResumePlan:
    """Exact resume when the loader state fits this run, elastic when it does not."""
    if state is None:
        return ResumePlan()
    if state["epoch"] != epoch:
        log.info("loader state is for epoch %s, not %s: ignored", state["epoch"], epoch)
        return ResumePlan()
    states = [dict(s) for s in state["workers"]]
    if state["num_workers"] == workers and (state["world"] == world or not split_world):
        return ResumePlan(int(state["next_worker"]), states, states, int(state["batches"]))
    log.info(
        "resuming a state of %s ranks x %s workers on %s x %s: re-planning the rest of epoch %s",
        state["world"],
        state["num_workers"],
        world,
        workers,
        epoch,
    )
    merged = elastic_merge(states)
    return ResumePlan(0, [merged], [merged] * workers, 0)
