"""The job's resume state: what :class:`~shardkit.WebLoader` saves and how a run starts from it.

A loader state is the *job's*, the same on every rank: for each rank of the run that saved
it, the cursor of each of its logical workers (a pipeline state, or None for a worker that
had not started), how many batches the rank had delivered and whose turn was next::

    {"stage": "webloader", "version": 2, "epoch": 3, "complete": false,
     "world": 3, "num_workers": 2, "pipeline": "[...fingerprint...]",
     "ranks": "[{\"rank\": 0, \"batches\": 41, \"next_worker\": 1, \"workers\": [...]}, ...]"}

``pipeline`` and ``ranks`` are JSON text, so that every state has the same shape whatever
the job: checkpoint libraries that match a state against the one they load into by its
keys (``torch.distributed.checkpoint``) then take it as it is.

Under an initialised process group every rank's ``state_dict()`` gathers all ranks'
entries; without one, a rank's state holds its own entry and :func:`merge_rank_states`
joins the states of every rank. ``pipeline`` is the fingerprint (:meth:`Stage.spec`): the
stages in order with their parameters and the manifest's content digest; a state whose
fingerprint differs is refused naming the stage and the field.

How a run starts from a state (:func:`resume_plan`): with the same world size and worker
count, each rank takes its own entry and continues exactly; with another, every
``(rank, worker)`` cursor of the old run is folded by the pipeline's stages
(:meth:`Stage.merge`) into one state from which the new ranks and workers re-plan what is
left of the epoch. A state saved after the epoch ended (``complete``) fits that epoch
(nothing is left) and the next (it starts fresh).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardkit.errors import ConfigError, StateDictError
from shardkit.stages import Context, Stage, check_state
from shardkit.stages.base import check_int, state_epoch

__all__ = [
    "carried_states",
    "EPOCH_MISMATCH",
    "STAGE",
    "VERSION",
    "Loaded",
    "ResumePlan",
    "check_dataset_state",
    "check_fingerprint",
    "check_job_state",
    "check_loadable",
    "dataset_state",
    "encode_job_state",
    "fits_epoch",
    "merge_rank_states",
    "resume_plan",
]

log = logging.getLogger(__name__)
STAGE = "webloader"
VERSION = 2
EPOCH_MISMATCH = ("raise", "discard")
DATASET = "dataset"
DATASET_VERSION = 2


def check_fingerprint(saved: Any, here: Sequence[Any], where: str = "pipeline") -> None:
    """Refuse a state whose pipeline fingerprint differs from ``here``, naming the stage and
    the field."""
    if not isinstance(saved, list):
        raise StateDictError(f"{where}: the state has no pipeline fingerprint (key 'pipeline')")
    if len(saved) != len(here):
        names = [s.get("stage") if isinstance(s, Mapping) else s for s in saved]
        now = [s.get("stage") if isinstance(s, Mapping) else s for s in here]
        raise StateDictError(f"{where}: the state was saved by stages {names}, this is {now}")
    for i, (a, b) in enumerate(zip(saved, here, strict=True)):
        if isinstance(a, list) and isinstance(b, list):
            check_fingerprint(a, b, f"{where}[{i}]")
            continue
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            if a != b:
                raise StateDictError(f"{where}: item {i} is {a!r} in the state, {b!r} here")
            continue
        stage = b.get("stage")
        if a.get("stage") != stage:
            raise StateDictError(
                f"{where}: stage {i} is {a.get('stage')!r} in the state, {stage!r} here"
            )
        for key in sorted(set(a) | set(b)):
            if key == "sources":
                for j, (sa, sb) in enumerate(zip(a.get(key, []), b.get(key, []), strict=False)):
                    check_fingerprint(sa, sb, f"{where} {stage} source {j}")
                if len(a.get(key, [])) != len(b.get(key, [])):
                    raise StateDictError(f"{where}: {stage}: the number of sources differs")
            elif a.get(key) != b.get(key):
                raise StateDictError(
                    f"{where}: stage {i} ({stage}): {key!r} is {a.get(key)!r} in the state, "
                    f"{b.get(key)!r} here"
                )


def dataset_state(
    epoch: int, complete: bool, fingerprint: list[Any], state: Mapping[str, Any]
) -> dict[str, Any]:
    """A :class:`~shardkit.ShardDataset`'s state: its pipeline's state in ``epoch``, and
    whether the epoch had ended (``complete``)."""
    return {
        "stage": DATASET,
        "version": DATASET_VERSION,
        "epoch": epoch,
        "complete": complete,
        "pipeline": fingerprint,
        "state": dict(state),
    }


def check_dataset_state(state: Any) -> tuple[int, bool, Any, dict[str, Any]]:
    """``(epoch, complete, fingerprint, pipeline state)`` of a data set's state, checked in
    shape (its fingerprint is the caller's to compare: some changes may be allowed)."""
    st = check_state(state, DATASET, DATASET_VERSION, ("epoch", "complete", "pipeline", "state"))
    epoch = check_int(st, DATASET, "epoch")
    if not isinstance(st["complete"], bool):
        raise StateDictError("dataset: key 'complete' must be true or false")
    tail = st["state"]
    if not isinstance(tail, Mapping) or state_epoch(tail) != epoch:
        raise StateDictError("dataset: the pipeline state is for another epoch")
    return epoch, st["complete"], st["pipeline"], copy.deepcopy(dict(tail))


def encode_job_state(st: Mapping[str, Any]) -> dict[str, Any]:
    """The state as saved: ``pipeline`` and ``ranks`` as JSON text."""
    out = dict(st)
    for key in ("pipeline", "ranks"):
        out[key] = json.dumps(st[key], separators=(",", ":"), sort_keys=True)
    return out


def check_job_state(state: Any) -> dict[str, Any]:
    """Decode a saved loader state and check its shape and every integer in it (type,
    sign, range)."""
    keys = ("epoch", "complete", "world", "num_workers", "pipeline", "ranks")
    st = check_state(state, STAGE, VERSION, keys)
    for key in ("pipeline", "ranks"):
        if isinstance(st[key], str):
            try:
                st[key] = json.loads(st[key])
            except ValueError as exc:
                raise StateDictError(f"{STAGE}: key {key!r} is not valid JSON: {exc}") from None
    check_int(st, STAGE, "epoch")
    world = check_int(st, STAGE, "world", 1)
    workers = check_int(st, STAGE, "num_workers", 1)
    if not isinstance(st["complete"], bool):
        raise StateDictError(f"{STAGE}: key 'complete' must be true or false")
    _check_retired(st.get("retired"))
    ranks = st["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise StateDictError(f"{STAGE}: key 'ranks' must be a non-empty list")
    seen: set[int] = set()
    for entry in ranks:
        if not isinstance(entry, Mapping):
            raise StateDictError(f"{STAGE}: every item of 'ranks' must be a dict")
        rank = check_int(entry, STAGE, "rank")
        if rank >= world or rank in seen:
            raise StateDictError(f"{STAGE}: rank {rank} is out of range or twice in 'ranks'")
        seen.add(rank)
        check_int(entry, STAGE, "batches")
        if check_int(entry, STAGE, "next_worker") >= workers:
            raise StateDictError(f"{STAGE}: rank {rank}: 'next_worker' is out of range")
        states = entry.get("workers")
        if not isinstance(states, list) or len(states) != workers:
            raise StateDictError(f"{STAGE}: rank {rank}: 'workers' needs {workers} states")
        if not all(w is None or isinstance(w, Mapping) for w in states):
            raise StateDictError(f"{STAGE}: rank {rank}: a worker state must be a dict or null")
    return st


def _check_retired(retired: Any) -> None:
    """The exposure of the sources a load removed: name -> {samples, tokens, epochs}."""
    if retired is None:
        return
    if not isinstance(retired, Mapping):
        raise StateDictError(f"{STAGE}: key 'retired' must be a dict of source name -> counts")
    for name, done in retired.items():
        if not isinstance(done, Mapping):
            raise StateDictError(f"{STAGE}: 'retired' source {name!r} must be a dict of counts")
        for key in ("samples", "tokens", "epochs"):
            check_int(done, f"{STAGE}: 'retired' source {name!r}", key)
        _check_cursor(done.get("cursor"), name)


def _check_cursor(grid: Any, name: str) -> None:
    """A removed source's cursor: by rank and worker, none or ``{"epoch", "source"}``."""
    if grid is None:
        return
    where = f"{STAGE}: 'retired' source {name!r}"
    if not isinstance(grid, list) or not all(isinstance(row, list) for row in grid):
        raise StateDictError(f"{where}: 'cursor' must be a list (ranks) of lists (workers)")
    for row in grid:
        for cur in row:
            if cur is None:
                continue
            if not isinstance(cur, Mapping) or not isinstance(cur.get("source"), Mapping | None):
                raise StateDictError(f"{where}: a 'cursor' entry must be {{epoch, source}}")
            check_int(cur, where, "epoch")


def fits_epoch(state: Mapping[str, Any], epoch: int) -> bool:
    """A state fits its own epoch; one saved after the epoch ended also fits the next."""
    return epoch == state["epoch"] or (bool(state["complete"]) and epoch == state["epoch"] + 1)


@dataclass(frozen=True)
class Loaded:
    """A state loaded into a data set or loader for its next iteration.

    Args:
        state: the (checked) state.
        epoch: the epoch it was saved in; complete: saved after that epoch ended.
        discard: drop it (with a warning) when ``set_epoch`` names an epoch it does not
            fit, instead of raising.
        who: the loading class's state name, for messages.
    """

    state: dict[str, Any]
    epoch: int
    complete: bool
    discard: bool
    who: str

    @staticmethod
    def discards(epoch_mismatch: str) -> bool:
        """Whether ``epoch_mismatch`` (``"raise"`` or ``"discard"``) says to discard."""
        if epoch_mismatch not in EPOCH_MISMATCH:
            raise ConfigError(f"epoch_mismatch must be one of {EPOCH_MISMATCH}")
        return epoch_mismatch == "discard"

    def at_epoch(self, epoch: int) -> Loaded | None:
        """This state for an iteration of ``epoch``; None when discarded for it.

        A state fits its own epoch and, when saved after that epoch ended, the next;
        another epoch raises :class:`StateDictError` (unless loaded with
        ``epoch_mismatch="discard"``): an off-by-one start epoch never replays or skips
        data silently.
        """
        facts = {"epoch": self.epoch, "complete": self.complete}
        if fits_epoch(facts, epoch):
            return self
        if not self.discard:
            e = self.epoch
            raise StateDictError(
                f"{self.who}: the loaded state is for epoch {e}"
                f"{' (ended)' if self.complete else ''}, not epoch {epoch}: start at "
                f"epoch {e}{' or ' + str(e + 1) if self.complete else ''}, or load it with "
                "epoch_mismatch='discard'"
            )
        log.warning("%s: state for epoch %s discarded for epoch %s", self.who, self.epoch, epoch)
        return None


def merge_rank_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One job state from the states the ranks of a job saved each on its own (a job run
    without a process group): same epoch, world, workers and fingerprint, one entry each."""
    if not states:
        raise StateDictError(f"{STAGE}: no states to merge")
    checked = [check_job_state(s) for s in states]
    first = checked[0]
    for st in checked[1:]:
        for key in ("epoch", "complete", "world", "num_workers", "pipeline"):
            if st[key] != first[key]:
                raise StateDictError(f"{STAGE}: the rank states differ in {key!r}")
    entries = {int(e["rank"]): e for st in checked for e in st["ranks"]}
    return encode_job_state({**first, "ranks": [entries[r] for r in sorted(entries)]})


@dataclass(frozen=True)
class ResumePlan:
    """How a loader's iteration starts: the worker rotation, the worker states to load
    (None: fresh; else one per logical worker, each a state or None) and the count of
    batches already delivered; ``done``: the epoch had ended, nothing is left."""

    rotation: int = 0
    states: list[dict[str, Any] | None] | None = None
    batches: int = 0
    done: bool = False


def resume_plan(state: Mapping[str, Any] | None, pipeline: Stage, where: Context) -> ResumePlan:
    """Exact resume when ``state`` was saved by a run like this one (``where``: this rank of
    the world, with ``where.workers`` logical workers, in ``where.epoch``), elastic when not."""
    rank, world, workers, epoch = where.rank, where.world, where.workers, where.epoch
    if state is None:
        return ResumePlan()
    if state["epoch"] != epoch:  # a state that ended epoch - 1 (see fits_epoch)
        return ResumePlan()
    if state["complete"]:
        return ResumePlan(done=True)
    ranks = {int(e["rank"]): e for e in state["ranks"]}
    if state["world"] == world and state["num_workers"] == workers:
        mine = ranks.get(rank)
        if mine is None:
            raise StateDictError(
                f"{STAGE}: the state holds the cursors of ranks {sorted(ranks)}, not rank "
                f"{rank}'s: save it with every rank calling state_dict() under the process "
                "group, or join per-rank states with WebLoader.merge_states"
            )
        states = [None if w is None else dict(w) for w in mine["workers"]]
        return ResumePlan(int(mine["next_worker"]), states, int(mine["batches"]))
    missing = sorted(set(range(int(state["world"]))) - set(ranks))
    if missing:
        raise StateDictError(
            f"{STAGE}: an elastic resume ({state['world']} ranks x {state['num_workers']} "
            f"workers -> {world} x {workers}) needs every rank's cursors; ranks {missing} "
            "are missing"
        )
    log.info(
        "resuming a state of %s ranks x %s workers on %s x %s: re-planning the rest of epoch %s",
        state["world"],
        state["num_workers"],
        world,
        workers,
        epoch,
    )
    grid = [ranks[r]["workers"] for r in range(int(state["world"]))]
    merged = pipeline.merge(grid)
    if merged is None:
        return ResumePlan()
    return ResumePlan(0, [merged] * workers, 0)


def check_loadable(st: Mapping[str, Any], pipeline: Stage, where: Context) -> None:
    """A checked job state that this rank (``where``, in the state's epoch) can resume
    from: every worker cursor is of the state's epoch, and the cursors its workers will
    start from can be made (made and dropped here, so a state that does not fit fails in
    the training process, not in a worker)."""
    for entry in st["ranks"]:
        for w in entry["workers"]:
            if w is not None and state_epoch(w) != st["epoch"]:
                raise StateDictError(
                    f"{STAGE}: rank {entry['rank']}'s worker state is for epoch "
                    f"{state_epoch(w)}, the state for epoch {st['epoch']}"
                )
    plan = resume_plan(st, pipeline, where)
    for w, ws in enumerate(plan.states or []):
        if ws is not None:
            pipeline.iterate(replace(where, worker=w), ws)


def carried_states(
    pipeline: Stage,
    last: Sequence[Mapping[str, Any] | None],
    loaded: Loaded | None,
    where: Context,
) -> list[dict[str, Any] | None] | None:
    """A fresh epoch's worker states: what the pipeline keeps from the epoch before (a
    mixture's exposure and progress, an endless mixture's cursors), from the worker states
    ``last`` of the latest iteration or from ``loaded`` (a state that ended the epoch
    before); None when it keeps nothing."""
    if loaded is not None:
        st = {**loaded.state, "complete": False}
        before = resume_plan(st, pipeline, replace(where, epoch=loaded.epoch))
        last = before.states or []
    carried = [pipeline.carry(s, where.epoch) for s in last]
    return carried if any(c is not None for c in carried) else None
