"""Recipe: what a :class:`~shardkit.ShardDataset` reads, built by WebDataset-named fluent
methods (the source's split, shuffle and epoch length; then decode, map, select, to_tuple,
batched, pack_tokens).

``shuffle``, ``split_by_node`` and ``split_by_worker`` configure the source, whatever their
place before ``batched``/``pack_tokens``. Fluent methods return a new recipe (the one they
are called on does not change), so two pipelines built from one base never share a stage.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from shardkit.errors import ConfigError
from shardkit.stages import (
    Batched,
    Context,
    Decode,
    Map,
    PackTokens,
    Select,
    ShardSource,
    Stage,
    ToTuple,
    sources_of,
)
from shardkit.stages.budget import BudgetBatched
from shardkit.stages.mixture import find_mix
from shardkit.stages.nominal import WithEpoch
from shardkit.stages.packing import collate_packed
from shardkit.values import as_int

__all__ = ["DEFAULT_BUFSIZE", "Recipe"]

DEFAULT_BUFSIZE = 1000
R = TypeVar("R", bound="Recipe")


def _boundaries(tail: Stage) -> bool:
    """``tail`` yields packed sequences with boundaries (collated by ``collate_packed``)."""
    return isinstance(tail, PackTokens) and tail.boundaries


def _torch_collate(samples: list[Any]) -> Any:
    return torch.utils.data.default_collate(samples)


class Recipe:
    """The pipeline a data set reads (its last stage) and its sources, with the fluent
    methods that make new ones."""

    def _setup(self, tail: Stage, sources: list[ShardSource], handler: str, seed: int) -> None:
        self._tail = tail
        self._sources = sources
        self._handler = handler
        self._seed = seed
        self._grouped = False
        self._given: Context | None = None  # split_by_node(rank=, world_size=)
        self._hint: Context | None = None  # the main process's world, sent to workers

    def _derive(self: R) -> R:
        """A copy with its own stages (user code shared): what every fluent method returns."""
        new = copy.copy(self)
        new._tail = self._tail.clone()
        new._sources = sources_of(new._tail)
        return new

    # -- source configuration ------------------------------------------------------
    def _planned(self: R, **choices: Any) -> R:
        """A recipe whose sources read by their plan with ``choices`` (fields of
        :class:`~shardkit.plan.assign.PlanConfig`), each source and the stages above it
        made again."""

        def swap(stage: Stage) -> Stage | None:
            if not isinstance(stage, ShardSource):
                return None
            return stage.planned(dataclasses.replace(stage.config, **choices))

        new = self._derive()
        new._tail = self._tail.rebuilt(swap)
        new._sources = sources_of(new._tail)
        return new

    def _before_grouping(self, what: str) -> None:
        if self._grouped:
            raise ConfigError(
                f"{what} works on samples at the source: call it before batched()/"
                "pack_tokens()/mix()"
            )

    def split_by_node(self: R, rank: int | None = None, world_size: int | None = None) -> R:
        """Give every rank its own, equally long share of each epoch."""
        self._before_grouping("split_by_node()")
        if (rank is None) != (world_size is None):
            raise ConfigError("split_by_node: give both rank and world_size, or neither")
        new = self._planned(by_node=True)
        if rank is not None and world_size is not None:
            new._given = Context(rank, world_size)  # validates
        return new

    def split_by_worker(self: R) -> R:
        """DataLoader workers split their rank's share (the default; kept for WebDataset code)."""
        self._before_grouping("split_by_worker()")
        return self._derive()

    def shuffle(self: R, bufsize: int = DEFAULT_BUFSIZE, initial: int | None = None) -> R:
        """Shuffle samples within a window of ``bufsize`` (default 1000, as WebDataset's
        examples use; see :mod:`shardkit.plan.order`). The shard order is shuffled every
        epoch already (``shardshuffle``); the window mixes samples of nearby shards."""
        self._before_grouping("shuffle()")
        bufsize = as_int(bufsize, "shuffle: bufsize", floats=False)  # True, inf: no shuffle
        initial = bufsize if initial is None else as_int(initial, "shuffle: initial", floats=False)
        if bufsize < 0 or not 0 < initial <= max(bufsize, 1):
            raise ConfigError(f"shuffle({bufsize}, initial={initial}): need 0 < initial <= bufsize")
        if bufsize <= 1:
            return self._planned(bufsize=None, initial=None)
        return self._planned(bufsize=bufsize, initial=initial)

    def with_epoch(self: R, n: int) -> R:
        """Make an epoch ``n`` items per rank, so that every rank yields as many and
        ``len()`` is known up front.

        On a resampled source (``resampled=True``), before any grouping: ``n`` samples per
        rank, planned. After ``mix``, ``pack_tokens`` or ``batched``: ``n`` of the items
        there (batches after ``batched``), split over the rank's workers (see
        :mod:`shardkit.stages.nominal`), over any pipeline: an endless one (a
        ``stop="never"`` mixture) gives them; a finite one that runs out first raises a
        :class:`~shardkit.errors.ConfigError` naming ``n`` (the length would be wrong). A
        stream of samples read once is refused: its epoch is the whole data set."""
        n = as_int(n, "with_epoch: n", low=1, floats=False)
        if self._grouped or find_mix(self._tail) is not None:
            return self._then(lambda up: WithEpoch(up, n))
        if not all(s.config.resampled for s in self._sources):
            raise ConfigError(
                "with_epoch() needs resampled=True: otherwise an epoch is the whole data set"
            )
        return self._planned(epoch_length=n)

    @property
    def grouped(self) -> bool:
        """The items are batches or token sequences, not samples (the source-level
        methods and :func:`~shardkit.mix` refuse such a data set)."""
        return self._grouped

    # -- stages ---------------------------------------------------------------------
    def _then(self: R, make: Callable[[Stage], Stage], *, grouped: bool = False) -> R:
        new = self._derive()
        new._tail = make(new._tail)
        new._grouped = self._grouped or grouped
        return new

    # -- stages (WebDataset's names) -------------------------------------------------
    def decode(
        self: R,
        *handlers: str | Mapping[str, Callable[[bytes], Any]] | Callable[[str, bytes], Any],
        allow_pickle: bool = False,
    ) -> R:
        """Decode fields by extension; images with Pillow; user handlers first."""
        return self._then(
            lambda up: Decode(up, *handlers, allow_pickle=allow_pickle, handler=self._handler)
        )

    def map(self: R, fn: Callable[[Any], Any]) -> R:
        """Apply ``fn`` to every item."""
        return self._then(lambda up: Map(up, fn))

    def select(self: R, predicate: Callable[[Any], bool]) -> R:
        """Keep the items ``predicate`` accepts (the epoch's length is then unknown)."""
        return self._then(lambda up: Select(up, predicate))

    def to_tuple(self: R, *fields: str) -> R:
        """Turn samples into tuples of these fields (``"jpg;png"``: the first present)."""
        return self._then(lambda up: ToTuple(up, *fields))

    def batched(
        self: R,
        n: int | None = None,
        collate: Callable[[list[Any]], Any] | str | None = None,
        *,
        partial: bool = True,
        budget: float | None = None,
        cost: str | Callable[[Any], float] | None = None,
        buffer: int = 1024,
    ) -> R:
        """Group ``n`` items, or (``budget=B``) items of total ``cost`` at most ``B``,
        packed from groups of 16 batches' cost, at most ``buffer`` items (see
        :mod:`shardkit.stages.budget`: every rank's batches then cost about the same).
        ``cost``: a field name (its element count) or ``item -> number``; ``collate``: a
        function, ``"numpy"`` (default) or ``"torch"``."""
        if collate == "torch":
            fn: Callable[[list[Any]], Any] | None = _torch_collate
        elif collate in (None, "numpy"):
            fn = collate_packed if _boundaries(self._tail) else None
        elif callable(collate):
            fn = collate
        else:
            raise ConfigError(
                f"batched: collate must be callable, 'numpy' or 'torch', not {collate!r}"
            )
        if budget is None:
            if n is None or cost is not None:
                raise ConfigError("batched: give n (items per batch), or budget= and cost=")
            size, samples = n, not self._grouped
            return self._then(lambda up: Batched(up, size, fn, partial, samples), grouped=True)
        if n is not None or cost is None:
            raise ConfigError("batched(budget=B) needs cost= (a field name or a callable), not n")
        how = cost
        return self._then(
            lambda up: BudgetBatched(up, budget, how, buffer=buffer, collate=fn), grouped=True
        )

    def pack_tokens(
        self: R,
        field: str,
        seq_len: int,
        *,
        eos: int | None = None,
        strategy: str = "greedy",
        buffer: int = 64,
        boundaries: bool = False,
        pad: int = 0,
        dtype: Any = None,
    ) -> R:
        """Pack ``field`` token arrays into ``seq_len``-token sequences: ``strategy``
        ``"greedy"`` cuts the stream, ``"best_fit"`` places whole documents from groups of
        ``buffer`` (padding with ``pad``); ``boundaries=True`` yields dicts with ``tokens``,
        ``position_ids`` and ``cu_seqlens``; ``dtype`` the output's (default: the widest
        seen; an id it cannot hold is an error; see :mod:`shardkit.stages.tokens`)."""

        def make(up: Stage) -> Stage:
            return PackTokens(
                up, field, seq_len, eos=eos, strategy=strategy, buffer=buffer,
                boundaries=boundaries, pad=pad, dtype=dtype,
            )  # fmt: skip

        return self._then(make, grouped=True)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def sources(self) -> list[ShardSource]:
        """The shard sources this data set reads (several after ``mix``)."""
        return list(self._sources)

    @property
    def splits_by_node(self) -> bool:
        return any(s.config.by_node for s in self._sources)

    def pipeline(self) -> Stage:
        """The last stage: the recipe (see :mod:`shardkit.stages.base`)."""
        return self._tail
