"""Where a loader's epoch stands, as the consumer side knows it after every batch: each
logical worker's cursor, the batches handed out and whose turn is next, a loaded state not
iterated yet, and the job state made of them (:meth:`Place.job_state`). The loader
(:mod:`shardkit.streaming.loader`) holds one and moves it on as it hands batches out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from shardkit.stages import Context
from shardkit.streaming.allow import Allowed, adapt_states, diff_fingerprints, replaying
from shardkit.streaming.dataset import ShardDataset
from shardkit.streaming.resume import (
    STAGE,
    VERSION,
    Loaded,
    carried_states,
    check_job_state,
    check_loadable,
    encode_job_state,
    resume_plan,
)
from shardkit.streaming.retired import retired_exposure

__all__ = ["Place"]

States = list[dict[str, Any] | None]


class Place:
    """The position of one rank's loader over ``dataset`` with ``logical`` workers.

    Attributes: ``states`` (each logical worker's cursor after its latest batch),
    ``where`` (this rank's context of the latest iteration), ``batches`` (handed out this
    epoch), ``next_worker`` (whose batch comes next), ``complete`` (the epoch ended),
    ``begun`` (the epoch the latest iteration began in), ``loaded`` (a state loaded and not
    iterated yet), ``voting`` (a load changed the batching: the ranks vote on the epoch end)
    and ``retired`` (the exposure of sources a load removed).
    """

    def __init__(self, dataset: ShardDataset, logical: int, fingerprint: list[Any]) -> None:
        self.dataset = dataset
        self.logical = logical
        self.fingerprint = fingerprint
        self.loaded: Loaded | None = None
        self.states: States = [None] * logical
        self.where = Context(workers=logical)
        self.batches = 0
        self.begun: int | None = None
        self.next_worker = 0
        self.complete = False
        self.voting = False
        self.retired: dict[str, dict[str, int]] = {}

    def _context(self, epoch: int) -> Context:
        return self.dataset.context(0, self.logical, epoch)

    def begin(self, epoch: int) -> dict[str, Any] | None:
        """Decide how an iteration of ``epoch`` starts (fresh, exact resume, elastic): what
        the workers' mailbox says, or None when a loaded state had ended the epoch."""
        where = self._context(epoch)
        self.where = where
        loaded, self.loaded = self.loaded, None
        st = None if loaded is None else loaded.state
        pipeline = self.dataset.pipeline()
        plan = resume_plan(st, pipeline, where)
        if plan.states is None and not plan.done:
            carried = carried_states(pipeline, self.states, loaded, where)
            plan = dataclasses.replace(plan, states=carried)
        self.batches = plan.batches
        self.begun = epoch
        self.states = list(plan.states) if plan.states else [None] * self.logical
        self.voting = bool(st and st.get("regrouped")) or replaying(plan.states)
        self.next_worker = plan.rotation
        self.complete = plan.done
        if plan.done:
            return None
        box = {"epoch": where.epoch, "rank": where.rank, "world": where.world}
        box["rotation"] = plan.rotation
        return {**box, "states": plan.states}

    def delivered(self, w: int, state: dict[str, Any] | None) -> None:
        """Logical worker ``w`` handed out a batch, after which its cursor is ``state``."""
        self.states[w] = state
        self.batches += 1
        self.next_worker = (w + 1) % self.logical

    def remaining(self, epoch: int, total: int) -> int | None:
        """Batches still to come in ``epoch`` of ``total`` (see ``WebLoader.remaining``)."""
        if self.loaded is not None:
            where = self._context(epoch)
            pending = self.loaded.state
            plan = resume_plan(pending, self.dataset.pipeline(), where)
            if plan.done:
                return 0
            exact = (pending["world"], pending["num_workers"]) == (where.world, where.workers)
            exact = exact and not pending.get("regrouped")
            return max(total - plan.batches, 0) if exact or plan.states is None else None
        if self.begun == epoch:
            return 0 if self.complete else max(total - self.batches, 0)
        return total

    def left(self, epoch: int) -> int:
        """The samples this rank's workers had still to give after their last delivered
        batch (0 where not known up front)."""
        tail = self.dataset.pipeline()
        where = [self.dataset.context(w, self.logical, epoch) for w in range(self.logical)]
        left = [tail.left(ctx, st) for ctx, st in zip(where, self.states, strict=True)]
        return sum(n for n in left if n is not None)

    def job_state(
        self,
        epoch: int,
        gather: Callable[[dict[str, Any]], list[dict[str, Any]]] | None,
    ) -> dict[str, Any]:
        """The job's resume state at ``epoch``; ``gather`` joins every rank's entry (None:
        this rank's alone)."""
        if self.loaded is not None:  # loaded and not iterated yet: the state as loaded
            return encode_job_state(self.loaded.state)
        entry = {
            "rank": self.where.rank,
            "batches": self.batches,
            "next_worker": self.next_worker,
            "workers": self.states,
        }
        complete = self.complete
        if self.begun is not None and self.begun != epoch:
            # set_epoch moved on since the last iteration: the next iter() starts this
            # epoch afresh (with what the pipeline carries over), and so does this state
            now = self._context(epoch)
            carried = carried_states(self.dataset.pipeline(), self.states, None, now)
            entry.update(batches=0, next_worker=0, workers=carried or [None] * self.logical)
            complete = False
        ranks: list[dict[str, Any]] = [entry]
        if gather is not None:
            ranks = sorted(gather(entry), key=lambda e: int(e["rank"]))
        retired = {"retired": self.retired} if self.retired else {}
        return encode_job_state(
            {
                **retired,
                "stage": STAGE,
                "version": VERSION,
                "epoch": epoch,
                "complete": complete,
                "world": self.where.world,
                "num_workers": self.logical,
                "pipeline": self.fingerprint,
                "ranks": ranks,
            }
        )

    def load(
        self,
        state: Mapping[str, Any],
        epoch_mismatch: str,
        allow: Collection[str] | Mapping[str, Any] | None,
        reweight: bool,
    ) -> int:
        """Check ``state`` against this pipeline (adapted by the changes ``allow``
        accepts) and hold it for the next iteration; returns its epoch."""
        discard = Loaded.discards(epoch_mismatch)
        allowed = Allowed.parse(allow, reweight)
        st = check_job_state(state)
        changes = diff_fingerprints(st["pipeline"], self.fingerprint, allowed.rename)
        allowed.check(changes)
        if changes:
            st = adapt_states(st, self.dataset.pipeline(), changes, allowed)
            st["pipeline"] = self.fingerprint  # saved again, it fits this pipeline
        check_loadable(st, self.dataset.pipeline(), self._context(st["epoch"]))
        self.loaded = Loaded(st, st["epoch"], st["complete"], discard, STAGE)
        self.retired = retired_exposure(st)
        return int(st["epoch"])

    def exposed(self) -> tuple[States, Context]:
        """The worker states a mixture's exposure is read from: a loaded state's for this
        rank before its first batch, else the latest batches'."""
        if self.loaded is None:
            return self.states, self.where
        where = self._context(self.loaded.epoch)
        plan = resume_plan({**self.loaded.state, "complete": False}, self.dataset.pipeline(), where)
        return list(plan.states or []), where
