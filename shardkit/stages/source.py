"""The source stage: read this worker's part of the plan, in (shuffled) order, resumably.

The order is fixed before a byte is read: :mod:`shardkit.plan.assign` says which sample ranges
this ``(rank, worker)`` reads, :mod:`shardkit.plan.order` in which order it emits them. The
state is a cursor - how many stream positions were emitted and the last one - so a
restore seeks (sample index) to the first shard range still needed, re-reads at most one
shuffle window and emits exactly the rest.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

from shardkit._types import Opener
from shardkit.cache import opener_for
from shardkit.errors import StateDictError
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import IoConfig
from shardkit.plan.assign import (
    Generation,
    PlanConfig,
    Ranges,
    ResampledStream,
    shuffle_window,
    stream_lengths,
)
from shardkit.plan.assign import worker_stream as plan_stream
from shardkit.plan.order import Window, iter_order, nth_output, resume_window
from shardkit.read.catalog import Catalog, open_catalog
from shardkit.read.policy import check_policy
from shardkit.read.stream import read_stream
from shardkit.stages.base import Context, Grid, Stage, check_int, check_state

__all__ = ["ShardSource", "sources_of"]

log = logging.getLogger(__name__)
Sample = dict[str, Any]
Stream = Ranges | ResampledStream


def _length(stream: Stream) -> int | None:
    return stream.total if isinstance(stream, Ranges) else stream.length


class ShardSource(Stage):
    """Samples of a shard set, as this rank and worker's share of an epoch's plan.

    Args:
        source: a manifest (path, url or :class:`Manifest`), a url list or a brace pattern.
        config: the plan choices (seed, shard shuffle, remainder, resampled, epoch length).
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
        self.bufsize: int | None = None
        self.initial: int | None = None
        self.by_node = False
        self._catalog: Catalog | None = None
        self._opener: Opener | None = None
        self._ctx = Context()
        self._history: tuple[Generation, ...] = ()
        self._pos = 0
        self._last = -1
        self._counts: dict[str, float] = self._zero()

    @staticmethod
    def _zero() -> dict[str, float]:
        return {"samples": 0, "bytes": 0, "skipped_shards": 0, "skipped_samples": 0}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_opener"] = None  # made again in each process (sessions do not pickle)
        return state

    def clone(self) -> ShardSource:
        new = copy.copy(self)
        new._pending = None
        new._counts = self._zero()
        return new

    # -- setup ---------------------------------------------------------------------
    def opener(self) -> Opener:
        if self._opener is None:
            self._opener = opener_for(self.io)
        return self._opener

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

    def configure(self, ctx: Context) -> None:
        self._ctx = ctx

    def _who(self, ctx: Context) -> tuple[int, int, int, int]:
        world, rank = (ctx.world, ctx.rank) if self.by_node else (1, 0)
        return world, rank, ctx.workers, ctx.worker

    def _stream(self, ctx: Context, history: Sequence[Generation], worker: int) -> Stream:
        world, rank, workers, _ = self._who(ctx)
        counts = self.catalog().counts
        return plan_stream(
            counts, self.config, ctx.epoch, world, rank, workers, worker, tuple(history)
        )

    def _window(self, ctx: Context, gen: int) -> Window | None:
        _, rank, _, worker = self._who(ctx)
        return shuffle_window(
            self.bufsize, self.initial, self.config.seed, ctx.epoch, gen, rank, worker
        )

    def lengths(self, ctx: Context) -> list[int] | None:
        history = self._history_of(self._pending) if self._pending else self._history
        world, _, workers, _ = self._who(ctx)
        return stream_lengths(self.catalog().total, self.config, world, workers, history)

    # -- state ---------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        catalog = self.catalog()
        c = self.config
        return {
            "seed": c.seed,
            "shardshuffle": c.shuffle_shards,
            "remainder": c.remainder,
            "resampled": c.resampled,
            "epoch_length": c.epoch_length,
            "bufsize": self.bufsize,
            "initial": self.initial,
            "split_by_node": self.by_node,
            "handler": self.policy,
            "nshards": len(catalog.shards),
            "nsamples": catalog.total,
            "manifest": catalog.digest,
        }

    def spec(self) -> list[Any]:
        return [{"stage": self.name, **self.params()}]

    def state_epoch(self, state: Mapping[str, Any]) -> int:
        return check_int(state, self.name, "epoch")

    def state_dict(self) -> dict[str, Any]:
        world, rank, workers, worker = self._who(self._ctx)
        if self._pending is not None:
            st = dict(self._pending)
            if st.get("world") is None:  # an elastic merge: position 0 of this run's share
                st.update(world=world, rank=rank, workers=workers, worker=worker)
            return st
        catalog = self.catalog()
        return {
            "stage": self.name,
            "version": self.version,
            "seed": self.config.seed,
            "epoch": self._ctx.epoch,
            "world": world,
            "rank": rank,
            "workers": workers,
            "worker": worker,
            "position": self._pos,
            "last": self._last,
            "shuffle": [self.bufsize, self.initial],
            "history": [g.to_dict() for g in self._history],
            "nshards": len(catalog.shards),
            "nsamples": catalog.total,
            "manifest": catalog.digest,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` against this pipeline and where it runs; resume at ``iter()``."""
        st = self._check_fit(state)
        history = self._history_of(st)
        if st["world"] is None:  # an elastic merge, not started since
            if st["position"] != 0:
                raise StateDictError("shards: a merged state must be at position 0")
            self._pending = st
            return
        world, rank, workers, worker = self._who(self._ctx)
        for key in ("world", "rank", "workers", "worker"):
            check_int(st, self.name, key, 1 if key in ("world", "workers") else 0)
        if (st["world"], st["workers"]) != (world, workers):
            raise StateDictError(
                f"shards: the state was saved by a run of {st['world']} ranks x "
                f"{st['workers']} workers, this is {world} x {workers}: load it through "
                "WebLoader.load_state_dict, which re-plans the rest of the epoch"
            )
        if (st["rank"], st["worker"]) != (rank, worker):
            raise StateDictError(
                f"shards: the state is rank {st['rank']} worker {st['worker']}'s, this is "
                f"rank {rank} worker {worker}: every rank loads the job's state through "
                "WebLoader.load_state_dict"
            )
        ctx = Context(st["epoch"], self._ctx.rank, self._ctx.world, worker, self._ctx.workers)
        stream = self._stream(ctx, history, worker)
        n = _length(stream)
        if n is not None and st["position"] > n:
            raise StateDictError(
                f"shards: key 'position' is {st['position']}, past the end of this stream "
                f"of {n} (rank {rank} worker {worker})"
            )
        want = self._last_of(n, self._window(ctx, len(history)), st["position"])
        if st.get("last", want) != want:
            raise StateDictError(
                f"shards: key 'last' is {st.get('last')!r}; position {st['position']} of "
                f"this stream ends at {want}"
            )
        self._pending = st

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
        if list(st.get("shuffle") or [None, None]) != [self.bufsize, self.initial]:
            raise StateDictError(
                f"shards: key 'shuffle': the state was saved with a shuffle buffer of "
                f"{st.get('shuffle')}, this pipeline has {[self.bufsize, self.initial]}"
            )
        check_int(st, self.name, "epoch")
        check_int(st, self.name, "position")
        return st

    @staticmethod
    def _last_of(n: int | None, window: Window | None, pos: int) -> int:
        """The stream position of the last of ``pos`` outputs (-1 for none)."""
        if pos == 0:
            return -1
        return nth_output(n, window, pos - 1)

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """One more generation in the history: what every ``(rank, worker)`` emitted."""
        rows = [list(r) for r in (grid if self.by_node else grid[:1])]
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
        gen = Generation(world, workers, tuple(positions), self.bufsize, self.initial)
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

    def _restore(self, ctx: Context, stream: Stream, window: Window | None) -> None:
        """Apply a loaded (and checked) state to this epoch's iteration."""
        st = self._take_pending()
        self._pos, self._last = 0, -1
        if st is None or st["world"] is None:
            return
        self._pos = int(st["position"])
        self._last = self._last_of(_length(stream), window, self._pos)

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Sample]:
        ctx = self._ctx
        self.catalog()
        st = self._pending
        if st is not None and st["epoch"] != ctx.epoch:
            self._pending = None
            raise StateDictError(
                f"shards: the state is for epoch {st['epoch']}, this iteration is epoch {ctx.epoch}"
            )
        self._history = self._history_of(st) if st is not None else ()
        stream = self._stream(ctx, self._history, self._who(ctx)[3])
        window = self._window(ctx, len(self._history))
        self._restore(ctx, stream, window)
        if window is None:
            return self._plain(stream)
        return self._shuffled(stream, window)

    def counters(self) -> dict[str, float]:
        return dict(self._counts)

    def _read(self, stream: Stream, start: int) -> Generator[tuple[int, Sample], None, None]:
        """Yield ``(stream position, sample)`` from ``start`` on (see :mod:`.reader`)."""
        return read_stream(
            stream.iter_ranges(start),
            self.catalog(),
            self.opener(),
            self._counts,
            self.policy,
            self.io.max_member,
        )

    def _plain(self, stream: Stream) -> Iterator[Sample]:
        counts = self._counts
        for spos, sample in self._read(stream, self._pos):
            self._pos = spos + 1
            self._last = spos
            counts["samples"] += 1
            yield sample
        n = _length(stream)
        if n is not None:
            self._pos, self._last = n, n - 1

    def _shuffled(self, stream: Stream, window: Window) -> Iterator[Sample]:
        n = _length(stream)
        counts = self._counts
        start, stale_below = 0, 0
        left: frozenset[int] = frozenset()
        if self._last >= 0:
            start, left_arr, stale_below = resume_window(n, window, self._last)
            left = frozenset(left_arr.tolist())
        reader = self._read(stream, start)
        buf: dict[int, Any] = {}
        frontier = start
        end = n if n is not None else 1 << 62
        try:
            for chunk in iter_order(n, window, after=self._last):
                for q in chunk.tolist():
                    while frontier <= q:
                        got = next(reader, None)
                        if got is None:
                            frontier = end
                            break
                        spos, sample = got
                        frontier = spos + 1
                        if spos >= stale_below or spos in left:
                            buf[spos] = sample
                    self._pos += 1
                    self._last = q
                    sample = buf.pop(q, None)
                    if sample is not None:
                        counts["samples"] += 1
                        yield sample
        finally:
            reader.close()


def sources_of(stage: Stage) -> list[ShardSource]:
    """The shard sources a pipeline reads, in order."""
    if isinstance(stage, ShardSource):
        return [stage]
    return [s for child in stage.children() for s in sources_of(child)]
