"""The source stage: this worker's part of the plan, in (shuffled) order, resumably.

The order is fixed before a byte is read: :mod:`shardkit.plan.assign` says which sample
ranges a ``(rank, worker)`` reads, :mod:`shardkit.plan.order` in which order it emits them.
The recipe (:class:`ShardSource`) checks a state and makes the cursor
(:class:`~shardkit.stages.reading.SourceCursor`) that reads from its position.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from shardkit._types import Opener
from shardkit.cache import opener_for
from shardkit.errors import StateDictError
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import IoConfig
from shardkit.per_process import PerProcess
from shardkit.plan.assign import PlanConfig, replan_dropped, stream_lengths
from shardkit.plan.assign import worker_stream as plan_stream
from shardkit.plan.generation import Generation, shuffle_window
from shardkit.plan.order import Window
from shardkit.plan.world import Context
from shardkit.read.catalog import Catalog, open_catalog
from shardkit.read.policy import check_policy
from shardkit.stages.base import Grid, Stage, check_int, check_state
from shardkit.stages.reading import SourceCursor, Stream, last_of, stream_length

__all__ = ["ShardSource", "sources_of"]


class ShardSource(Stage):
    """Samples of a shard set, as a rank and worker's share of an epoch's plan.

    Args:
        source: a manifest (path, url or :class:`Manifest`), a url list or a brace pattern.
        config: the plan choices (seed, shard shuffle, remainder, resampled, epoch length,
            sample shuffle window, split by node).
        handler: ``"raise"``, ``"warn"`` or ``"skip_shard"`` (see :mod:`.policy`).
        allow_unsafe_urls: let a manifest name urls outside its base (or ``pipe:``).
        allow_incomplete: read a manifest whose build did not finish (refused otherwise).
        io: the io options (remote reads, cache); default: local reads, no cache.
    """

    name = "shards"
    version = 1

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Manifest,
        *,
        config: PlanConfig,
        handler: str = "raise",
        allow_unsafe_urls: bool = False,
        io: IoConfig | None = None,
        allow_incomplete: bool = False,
    ) -> None:
        super().__init__(None)
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        self.what = source if isinstance(source, (str, Manifest)) else list(source)
        self.config = config
        self.policy = check_policy(handler)
        self.allow_unsafe_urls = allow_unsafe_urls
        self.io = io or IoConfig()
        self.allow_incomplete = allow_incomplete
        self._catalog: Catalog | None = None
        self._opener = PerProcess(partial(opener_for, self.io))

    def planned(self, config: PlanConfig) -> ShardSource:
        """This source read by another plan (a new recipe; this one is unchanged)."""
        new = copy.copy(self)
        new.config = config
        return new

    # -- setup ---------------------------------------------------------------------
    def opener(self) -> Opener:
        """This process's opener (made at first use in each process)."""
        return self._opener.get()

    def io_stats(self) -> dict[str, float]:
        """The io counters of this process's opener (none before its first read)."""
        opener = self._opener.peek()
        return {} if opener is None else opener.stats()

    def drain(self) -> None:
        """Release this process's prefetch leases (the epoch is read); fills still running
        (of shards read in part) go on, as waiting for them would delay the epoch's end."""
        drain = getattr(self._opener.peek(), "drain", None)
        if drain is not None:
            drain(0)

    def catalog(self) -> Catalog:
        """The shard list, loaded once (in the main process it then pickles to workers)."""
        if self._catalog is None:
            self._catalog = open_catalog(
                self.what,
                self.opener(),
                io=self.io,
                allow_unsafe_urls=self.allow_unsafe_urls,
                allow_incomplete=self.allow_incomplete,
            )
        return self._catalog

    def where(self, ctx: Context) -> Context:
        """The plan's view of ``ctx``: without ``split_by_node`` every rank is rank 0 of 1."""
        return ctx if self.config.by_node else Context(0, 1, ctx.worker, ctx.workers, ctx.epoch)

    def _stream(self, where: Context, history: Sequence[Generation]) -> Stream:
        return plan_stream(self.catalog().counts, self.config, where, tuple(history))

    def _window(self, where: Context, gen: int) -> Window | None:
        c, w = self.config, where
        return shuffle_window(c.bufsize, c.initial, c.seed, w.epoch, gen, w.rank, w.worker)

    # -- the protocol ----------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        catalog = self.catalog()
        c = self.config
        return {
            "seed": c.seed,
            "shardshuffle": c.shuffle_shards,
            "remainder": c.remainder,
            "resampled": c.resampled,
            "epoch_length": c.epoch_length,
            "bufsize": self.config.bufsize,
            "initial": self.config.initial,
            "split_by_node": self.config.by_node,
            "handler": self.policy,
            "nshards": len(catalog.shards),
            "nsamples": catalog.total,
            "manifest": catalog.digest,
        }

    def endless(self) -> int | None:
        """A resampled stream without an epoch length never ends: one pass is the data
        set's samples."""
        c = self.config
        return self.catalog().total if c.resampled and c.epoch_length is None else None

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        """The stream positions after ``state``'s (all of them without one)."""
        lengths = self.lengths(ctx, state)
        if lengths is None:
            return None
        done = 0 if state is None else int(state.get("position", 0))
        return max(lengths[ctx.worker] - done, 0)

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        history = () if state is None else self._history_of(state)
        where = self.where(ctx)
        return stream_lengths(
            self.catalog().total, self.config, where.world, where.workers, history
        )

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> SourceCursor:
        """The cursor of ``ctx``'s stream, at the position of ``state`` (checked: it must
        be this worker's of a run like this one, or an elastic merge's)."""
        catalog = self.catalog()
        where = self.where(ctx)
        history: tuple[Generation, ...] = ()
        pos = 0
        merged = False
        if state is not None:
            st = self._check_fit(state)
            if st["epoch"] != ctx.epoch:
                raise StateDictError(
                    f"shards: the state is for epoch {st['epoch']}, this iteration is epoch "
                    f"{ctx.epoch}"
                )
            history = self._history_of(st)
            merged = st["world"] is None
            if merged:  # an elastic merge: position 0 of this run's share
                if st["position"] != 0:
                    raise StateDictError("shards: a merged state must be at position 0")
            else:
                self._check_where(st, where)
                pos = st["position"]
        stream = self._stream(where, history)
        window = self._window(where, len(history))
        if state is not None:
            self._check_position(state, where, stream, window)
        base = {
            "stage": self.name,
            "version": self.version,
            "seed": self.config.seed,
            "shuffle": [self.config.bufsize, self.config.initial],
            "history": [g.to_dict() for g in history],
            "nshards": len(catalog.shards),
            "nsamples": catalog.total,
            "manifest": catalog.digest,
        }
        read = (catalog, self.opener(), self.policy, self.io.limits)
        cursor = SourceCursor(where, base, stream, window, pos, read)
        if merged and where.rank == where.worker == 0:
            # what the re-plan leaves out is no new rank's: counted once, by the first stream
            dropped = replan_dropped(catalog.total, self.config, where.world, history)
            cursor.counts["dropped_samples"] = dropped
        return cursor

    # -- checks --------------------------------------------------------------------
    def _check_where(self, st: Mapping[str, Any], where: Context) -> None:
        """A saved (not merged) state must be this very worker's, of a run of this shape."""
        for key in ("world", "rank", "workers", "worker"):
            check_int(st, self.name, key, 1 if key in ("world", "workers") else 0)
        if (st["world"], st["workers"]) != (where.world, where.workers):
            raise StateDictError(
                f"shards: the state was saved by a run of {st['world']} ranks x "
                f"{st['workers']} workers, this is {where.world} x {where.workers}: load it "
                "through WebLoader.load_state_dict, which re-plans the rest of the epoch"
            )
        if (st["rank"], st["worker"]) != (where.rank, where.worker):
            raise StateDictError(
                f"shards: the state is rank {st['rank']} worker {st['worker']}'s, this is "
                f"rank {where.rank} worker {where.worker}: every rank loads the job's state "
                "through WebLoader.load_state_dict"
            )

    def _check_position(
        self, st: Mapping[str, Any], where: Context, stream: Stream, window: Window | None
    ) -> None:
        """The position must lie in the stream and ``last`` must be where it ends."""
        n = stream_length(stream)
        if n is not None and st["position"] > n:
            raise StateDictError(
                f"shards: key 'position' is {st['position']}, past the end of this stream "
                f"of {n} (rank {where.rank} worker {where.worker})"
            )
        if st["world"] is None:
            return
        want = last_of(n, window, st["position"])
        if st.get("last", want) != want:
            raise StateDictError(
                f"shards: key 'last' is {st.get('last')!r}; position {st['position']} of "
                f"this stream ends at {want}"
            )

    def _check_fit(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The parts of a state that must match this pipeline whatever the world."""
        keys = ("seed", "epoch", "world", "workers", "position", "history", "nshards", "nsamples")
        st = check_state(state, self.name, self.version, keys)
        catalog = self.catalog()
        if (st["nshards"], st["nsamples"]) != (len(catalog.shards), catalog.total):
            raise StateDictError(
                f"shards: the state was saved for {st['nshards']} shards with "
                f"{st['nsamples']} samples, this data set has {len(catalog.shards)} with "
                f"{catalog.total}"
            )
        if "manifest" in st and st["manifest"] != catalog.digest:
            raise StateDictError(
                "shards: key 'manifest': the state was saved for shards of other content "
                f"(fingerprint {st['manifest']!r}, these are {catalog.digest!r})"
            )
        if st["seed"] != self.config.seed:
            raise StateDictError(
                f"shards: the state was saved with seed {st['seed']}, this pipeline has "
                f"seed {self.config.seed}"
            )
        window = [self.config.bufsize, self.config.initial]
        if list(st.get("shuffle") or [None, None]) != window:
            raise StateDictError(
                f"shards: key 'shuffle': the state was saved with a shuffle buffer of "
                f"{st.get('shuffle')}, this pipeline has {window}"
            )
        check_int(st, self.name, "epoch")
        check_int(st, self.name, "position")
        return st

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """One more generation in the history: what every ``(rank, worker)`` emitted."""
        rows = [list(r) for r in (grid if self.config.by_node else grid[:1])]
        found = [st for row in rows for st in row if st is not None]
        if not found:
            return None
        first = self._check_fit(found[0])
        for st in found[1:]:
            same = self._check_fit(st)
            for key in ("epoch", "history"):
                if same[key] != first[key]:
                    raise StateDictError(
                        f"shards: key {key!r} differs between the worker states of one run"
                    )
        if all(st["world"] is None for st in found):
            return dict(first)  # no place of this run started: it consumed nothing, planned nothing
        world, workers = len(rows), len(rows[0])
        positions = []
        for r, row in enumerate(rows):
            line = []
            for w, cur in enumerate(row):
                if cur is None or cur["world"] is None:  # had not started: nothing consumed
                    line.append(0)
                    continue
                where = (cur["world"], cur["workers"], cur["rank"], cur["worker"])
                if where != (world, workers, r, w):
                    raise StateDictError(
                        f"shards: the state in place of rank {r} worker {w} of a {world} x "
                        f"{workers} run is (world, workers, rank, worker) {where}"
                    )
                line.append(cur["position"])
            positions.append(tuple(line))
        gen = Generation(world, workers, tuple(positions), self.config.bufsize, self.config.initial)
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

    @staticmethod
    def _history_of(state: Mapping[str, Any]) -> tuple[Generation, ...]:
        raw = state.get("history")
        if not isinstance(raw, list):
            raise StateDictError("shards: key 'history' must be a list")
        return tuple(Generation.from_dict(g) for g in raw)


def sources_of(stage: Stage) -> list[ShardSource]:
    """The shard sources a pipeline reads, in order."""
    if isinstance(stage, ShardSource):
        return [stage]
    return [s for child in stage.children() for s in sources_of(child)]
