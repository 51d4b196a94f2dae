"""ShardDataset: a torch ``IterableDataset`` over a shard set, with WebDataset-named stages.

::

    ds = (ShardDataset("shards/manifest.json", seed=17)
          .split_by_node()          # equal sample counts on every rank, every epoch
          .split_by_worker()        # (the default) workers split their rank's share
          .shuffle(10_000)
          .decode()
          .to_tuple("tokens.npy", "json")
          .batched(32))

The order of samples is a pure function of the manifest's sample counts, the seed, the
epoch, the world size, the rank and the worker count (:mod:`shardkit.plan.assign`,
:mod:`shardkit.plan.order`): ``shuffle``, ``split_by_node`` and ``split_by_worker`` configure
the source, whatever their place before ``batched``/``pack_tokens``. Samples are dicts
with ``__key__`` and ``__url__`` and one ``bytes`` value per field until ``decode`` and
``to_tuple``. Fluent methods return a new data set (the one they are called on does not
change), so two pipelines built from one base never share a stage.

Rank and world size come from ``split_by_node(rank=, world_size=)``, else from an
initialised ``torch.distributed`` group or torchrun's ``RANK``/``WORLD_SIZE``, read in the
main process (also when the data set is pickled to spawned DataLoader workers).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from shardkit.counters import add_counts
from shardkit.format.manifest.model import Manifest
from shardkit.io import manifest_source
from shardkit.io.config import IoConfig, with_cache
from shardkit.io.verified import VERIFY_TIME
from shardkit.plan.assign import PlanConfig
from shardkit.plan.world import WorldInfo
from shardkit.read.policy import check_policy
from shardkit.stages import (
    Context,
    ShardSource,
    Stage,
    sources_of,
)
from shardkit.stages.epoch import Epoch
from shardkit.streaming.allow import Allowed, adapt_state, diff_fingerprints
from shardkit.streaming.frameworks import check_framework
from shardkit.streaming.recipe import Recipe
from shardkit.streaming.resume import Loaded, check_dataset_state, dataset_state
from shardkit.values import as_int

__all__ = ["ShardDataset"]

log = logging.getLogger(__name__)


class ShardDataset(Recipe, IterableDataset[Any]):
    """Samples of a shard set: a manifest (path, url or :class:`Manifest`; a folder, local
    or a remote url ending in ``/``, is its ``manifest.json``), a url list or a brace
    pattern such as ``"data-{000000..000099}.tar"``.

    Args:
        source: what to read.
        seed: the data order seed; the order depends on it, the epoch and the world only.
        shardshuffle: shuffle the shard order every epoch (else manifest order).
        remainder: ``"drop"`` (default) or ``"pad"``: what happens to the samples that do
            not divide by the world size (see :mod:`shardkit.plan.assign`).
        resampled: draw shards with replacement, endlessly (see :meth:`with_epoch`).
        handler: bad-data policy ``"raise"``, ``"warn"`` or ``"skip_shard"``, or one of
            webdataset's handler functions (``wds.reraise_exception``,
            ``wds.warn_and_continue``, ``wds.ignore_and_continue``: see
            :mod:`shardkit.read.policy`).
        allow_unsafe_urls: let the manifest name urls outside its base or ``pipe:``.
        allow_incomplete: read a manifest whose build did not finish (refused otherwise).
        cache_dir: node-local cache directory for remote shards (a shortcut for the
            field of ``io``).
        cache_limit: the cache's byte limit (``"500GB"``).
        io: every io option (:class:`~shardkit.io.config.IoConfig`: timeouts, ranged
            request size, retries, prefetch, S3 endpoint, largest member...).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Manifest,
        *,
        seed: int = 0,
        shardshuffle: bool = True,
        remainder: str = "drop",
        resampled: bool = False,
        handler: str | Callable[[BaseException], Any] = "raise",
        allow_unsafe_urls: bool = False,
        allow_incomplete: bool = False,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
        io: IoConfig | None = None,
    ) -> None:
        super().__init__()
        seed = as_int(seed, "ShardDataset: seed", low=0, floats=False)
        config = PlanConfig(seed, shardshuffle, remainder, resampled, None)
        io = with_cache(io, cache_dir, cache_limit)
        handler = check_policy(handler)
        if isinstance(source, (str, os.PathLike)):
            source = manifest_source(os.fspath(source))  # a build's -o: its manifest.json
        src = ShardSource(
            source,
            config=config,
            handler=handler,
            allow_unsafe_urls=allow_unsafe_urls,
            io=io,
            allow_incomplete=allow_incomplete,
        )
        self._setup(src, [src], handler, seed)

    def _setup(self, tail: Stage, sources: list[ShardSource], handler: str, seed: int) -> None:
        super()._setup(tail, sources, handler, seed)
        self._epoch = 0
        self._loaded: Loaded | None = None  # a state for the next iteration
        self._cursor: Epoch | None = None  # this process's latest iteration
        self._counted: dict[str, float] = {}  # the counters of the iterations before it

    @classmethod
    def over(cls, stage: Stage, like: ShardDataset, *, seed: int) -> ShardDataset:
        """A data set over ``stage``, a pipeline built from other data sets' (as
        :func:`~shardkit.mix` builds one), reading with ``like``'s handler and world."""
        obj = cls.__new__(cls)
        obj._setup(stage, sources_of(stage), like._handler, seed)
        obj._given = like._given
        return obj

    def _derive(self) -> ShardDataset:
        new = super()._derive()
        new._loaded, new._cursor, new._counted = None, None, {}
        return new

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_cursor=None, _counted={})  # an iteration stays in its process
        if state["_given"] is None and state["_hint"] is None:
            w = WorldInfo.detect()  # the main process knows the process group
            state["_hint"] = Context(w.rank, w.world_size)
        return state

    # -- where and when ------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (the order changes with it).

        A loaded state fits its own epoch (and, saved after that epoch ended, the next):
        any other raises :class:`StateDictError`, unless it was loaded with
        ``epoch_mismatch="discard"``.
        """
        epoch = as_int(epoch, "set_epoch: epoch", low=0, floats=False)
        check_framework(self.splits_by_node, self._length)
        if self._loaded is not None:
            self._loaded = self._loaded.at_epoch(epoch)
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch

    def context(self, worker: int = 0, workers: int = 1, epoch: int | None = None) -> Context:
        """Where an iteration of this process runs: the rank and world this data set splits
        by, ``worker`` of ``workers``, ``epoch`` (default: the current one)."""
        where = self._given or self._hint
        if where is None:
            w = WorldInfo.detect()
            where = Context(w.rank, w.world_size)
        epoch = self._epoch if epoch is None else epoch
        return Context(where.rank, where.world, worker, workers, epoch)

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Epoch:
        """Read ``ctx``'s part of ``ctx.epoch`` from the pipeline state ``state`` (None: from
        the start): the one way a data set is read, by its own ``iter()`` and by a
        :class:`~shardkit.WebLoader`'s workers. It becomes this process's current
        iteration (:meth:`counters`)."""
        for src in self._sources:
            src.catalog()
        cursor = Epoch(self._tail.iterate(ctx, state), self._sources, ctx.epoch)
        if self._cursor is not None:
            add_counts(self._counted, self._cursor.counters())
        self._cursor = cursor
        return cursor

    def __iter__(self) -> Iterator[Any]:
        check_framework(self.splits_by_node, self._length)
        info = get_worker_info()
        ctx = self.context(info.id, info.num_workers) if info is not None else self.context()
        loaded, self._loaded = self._loaded, None
        if loaded is None or loaded.epoch != ctx.epoch:  # none, or one that ended epoch - 1
            before = self._cursor.state() if self._cursor is not None else None
            if loaded is not None:
                before = loaded.state
            return self.iterate(ctx, self._tail.carry(before, ctx.epoch))
        cursor = self.iterate(ctx, loaded.state)
        if loaded.complete:  # the epoch had ended: nothing is left
            cursor.complete = True
            return iter(())
        return cursor

    def lengths(self, workers: int = 1) -> list[int] | None:
        """Items each of ``workers`` workers yields this epoch (None: not known up front)."""
        ctx = self.context(0, max(workers, 1))
        for s in self._sources:
            s.catalog()
        return self._tail.lengths(ctx, self._epoch_state())

    def _length(self) -> int | None:
        lengths = self.lengths(1)
        return None if lengths is None else sum(lengths)

    def __getitem__(self, index: Any) -> Any:
        """Refused: a ShardDataset streams; :class:`~shardkit.IndexedShards` reads by index."""
        raise TypeError(
            f"ShardDataset[{index!r}]: a ShardDataset streams its samples (iterate it, or "
            "give it to a WebLoader); for sample i or a sample by key use "
            "sk.IndexedShards(manifest) (ds[i], ds.get(key)), a map-style Dataset over the "
            "same shards"
        )

    def __len__(self) -> int:
        """Items this rank yields in an epoch, read by one process (WebLoader: by workers)."""
        check_framework(self.splits_by_node, self._length)
        lengths = self.lengths(1)
        if lengths is None:
            raise TypeError(
                "the length of this data set is not known up front "
                "(select, pack_tokens, mix or endless resampling)"
            )
        return sum(lengths)

    # -- state ---------------------------------------------------------------------
    def _epoch_state(self) -> dict[str, Any] | None:
        """The pipeline state the current epoch runs from (its elastic history): a loaded
        one, else the current iteration's (None: a fresh epoch)."""
        if self._loaded is not None and self._loaded.epoch == self._epoch:
            return self._loaded.state
        if self._cursor is not None and self._cursor.epoch == self._epoch:
            return self._cursor.state()
        return None

    def fingerprint(self) -> list[Any]:
        """What a state of this pipeline fits: each stage and its parameters, the manifest's
        content digest included."""
        for src in self._sources:
            src.catalog()
        return self._tail.spec()

    def state_dict(self) -> dict[str, Any]:
        """Where this process's iteration is (valid between two items it hands out).

        For a loader with workers or under DDP use :meth:`WebLoader.state_dict`.
        """
        loaded, cursor, fingerprint = self._loaded, self._cursor, self.fingerprint()
        if loaded is not None:  # loaded and not iterated yet: the state as loaded
            return dataset_state(loaded.epoch, loaded.complete, fingerprint, loaded.state)
        if cursor is None or cursor.epoch != self._epoch:
            cursor = Epoch(self._tail.iterate(self.context()), self._sources, self._epoch)
        return dataset_state(cursor.epoch, cursor.complete, fingerprint, cursor.state())

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        epoch_mismatch: str = "raise",
        allow: Collection[str] | Mapping[str, Any] | None = None,
    ) -> None:
        """Resume from ``state`` at the next ``iter()``, in the state's epoch.

        Args:
            state: from :meth:`state_dict`.
            epoch_mismatch: ``"raise"`` (default) when a later ``set_epoch`` names an
                epoch the state does not fit, or ``"discard"`` the state then.
            allow: the changes of the pipeline since the state was saved that the load
                accepts (refused by default, naming the change and the value), as
                :meth:`WebLoader.load_state_dict`'s: ``"batch_size"``, ``"sources"``
                (renames: ``{"sources": {"old": "new"}}``), ``"seq_len"``, ``"weights"``.
                A data set keeps no exposure: a removed source's is dropped.
        """
        discard = Loaded.discards(epoch_mismatch)
        allowed = Allowed.parse(allow, False)
        epoch, complete, saved, tail = check_dataset_state(state)
        changes = diff_fingerprints(saved, self.fingerprint(), allowed.rename)
        allowed.check(changes)
        adapt_state(tail, self._tail, changes, allowed, {})
        self._tail.iterate(self.context(epoch=epoch), tail)  # checks it: a cursor, dropped
        self._loaded = Loaded(tail, epoch, complete, discard, "dataset")
        self._epoch = epoch

    def counters(self) -> dict[str, float]:
        """Samples, bytes and skips so far in this process."""
        out = dict(self._counted)
        if self._cursor is not None:
            add_counts(out, self._cursor.counters())
        return out

    def io_stats(self) -> dict[str, float]:
        """The io counters of this process's openers, summed, and the seconds it spent
        verifying what it read (``verify_s``)."""
        out: dict[str, float] = {}
        for s in self._sources:
            add_counts(out, s.io_stats())
        out["verify_s"] = float(VERIFY_TIME.snapshot().get("verify_s", 0.0))
        return out
