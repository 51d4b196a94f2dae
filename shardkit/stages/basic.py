"""The stages without a position of their own: map, select, to_tuple, batched (their
cursor's state is their upstream's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from typing import Any

from shardkit.errors import ConfigError, DecodeError
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Fruitless, Grid, Stage, Step, callable_name
from shardkit.stages.collate import collate_numpy
from shardkit.stages.regroup import (
    dropped_in,
    left_after,
    merge_held,
    open_upstream,
    settled,
    with_dropped,
)
from shardkit.values import as_int

__all__ = ["Batched", "Map", "Select", "ToTuple"]


class Map(Step):
    """Apply ``fn`` to every item."""

    name = "map"

    def __init__(self, upstream: Stage, fn: Callable[[Any], Any]) -> None:
        super().__init__(upstream)
        self.fn = fn

    def params(self) -> dict[str, Any]:
        return {"fn": callable_name(self.fn)}

    def run(self, items: Iterator[Any]) -> Iterator[Any]:
        fn = self.fn
        for item in items:
            yield fn(item)


class Select(Step):
    """Keep the items for which ``predicate`` is true (the epoch length is then unknown)."""

    name = "select"

    def __init__(self, upstream: Stage, predicate: Callable[[Any], bool]) -> None:
        super().__init__(upstream)
        self.predicate = predicate

    def params(self) -> dict[str, Any]:
        return {"predicate": callable_name(self.predicate)}

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        up = self._up().iterate(ctx, state)
        cur = Cursor(up)
        cur.items = self._kept(up, cur.own)
        return cur

    def run(self, items: Iterator[Any]) -> Iterator[Any]:
        return self._kept(items, {})

    def _kept(self, items: Iterator[Any], own: dict[str, float]) -> Iterator[Any]:
        """The items kept; each one refused is counted in ``own`` as ``filtered_samples``
        and taken off ``samples`` (what goes on is what reaches the training loop)."""
        pred = self.predicate
        fruitless = Fruitless(f"select({callable_name(pred)})", self._up())
        own["filtered_samples"] = own["samples"] = 0.0
        for item in items:
            if pred(item):
                fruitless.kept()
                yield item
            else:
                own["filtered_samples"] += 1
                own["samples"] -= 1
                fruitless.dropped()

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        return None


class ToTuple(Step):
    """Turn a sample dict into a tuple of fields; ``"jpg;png"`` takes the first present."""

    name = "to_tuple"

    def __init__(self, upstream: Stage, *fields: str) -> None:
        super().__init__(upstream)
        if not fields:
            raise ConfigError("to_tuple needs at least one field name")
        self.fields = [f.split(";") for f in fields]

    def params(self) -> dict[str, Any]:
        return {"fields": [";".join(f) for f in self.fields]}

    def run(self, items: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        fields = self.fields
        if all(len(f) == 1 for f in fields):
            names = [f[0] for f in fields]
            for sample in items:
                try:
                    yield tuple([sample[n] for n in names])
                except KeyError:
                    raise self._missing(sample) from None
            return
        for sample in items:
            yield tuple(self._pick(sample, alts) for alts in fields)

    def _pick(self, sample: dict[str, Any], alts: list[str]) -> Any:
        for name in alts:
            if name in sample:
                return sample[name]
        raise self._missing(sample)

    def _missing(self, sample: dict[str, Any]) -> DecodeError:
        want = [";".join(f) for f in self.fields]
        have = sorted(k for k in sample if not k.startswith("__"))
        return DecodeError(
            f"to_tuple{tuple(want)}: a field is missing; the sample has {have}",
            key=str(sample.get("__key__")),
        )


class Batched(Step):
    """Group ``n`` items into one batch with ``collate`` (numpy collation by default).

    Its state is its upstream's; after a batching change it may start from another
    batching's state (see :func:`~shardkit.stages.regroup.open_upstream`).

    Args:
        upstream: the stage before.
        n: items per batch.
        collate: ``list[item] -> batch``.
        partial: yield a last batch of fewer than ``n`` items (else drop it).
        samples: the items are samples (no packing or batching before): a dropped last
            batch's are counted as ``dropped_samples``, not as ``samples`` delivered.
    """

    name = "batched"

    def __init__(
        self,
        upstream: Stage,
        n: int,
        collate: Callable[[list[Any]], Any] | None = None,
        partial: bool = True,
        samples: bool = False,
    ) -> None:
        super().__init__(upstream)
        self.n = as_int(n, "batched: the batch size n", low=1, floats=False)
        self.collate = collate or collate_numpy
        self.partial = partial
        self.samples = samples

    def params(self) -> dict[str, Any]:
        return {"n": self.n, "partial": self.partial, "collate": callable_name(self.collate)}

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        up = open_upstream(self._up(), ctx, state)
        cur = Cursor(up)
        cur.own["collate_s"] = 0.0
        cur.items = self._batches(up, cur.own)
        return cur

    def run(self, items: Iterator[Any]) -> Iterator[Any]:
        return self._batches(items, {"collate_s": 0.0})

    def _batches(self, items: Iterator[Any], own: dict[str, float]) -> Iterator[Any]:
        """The batches; the seconds collation took are added to ``own["collate_s"]``."""
        n = self.n
        batch: list[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == n:
                yield self._collated(batch, own)
                batch = []
        if batch and self.partial:
            yield self._collated(batch, own)
        elif batch and self.samples:  # never reach the training loop
            own["samples"] = own.get("samples", 0.0) - len(batch)
            own["dropped_samples"] = own.get("dropped_samples", 0.0) + len(batch)

    def _collated(self, batch: list[Any], own: dict[str, float]) -> Any:
        t = perf_counter()
        out = self.collate(batch)
        own["collate_s"] += perf_counter() - t
        return out

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """The upstream's merge, with the items a replay's group held and had not given
        (after a batching change; given first: :func:`~shardkit.stages.regroup.merge_held`)."""
        return with_dropped(merge_held(self._up(), grid), dropped_in(grid))

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        return left_after(self._up(), ctx, state, self.name)

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        return super().carry(settled(state), epoch)

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        if settled(state) is not state:  # a replay after a batching change
            return None
        up = self._up().lengths(ctx, state)
        if up is None:
            return None
        if self.partial:
            return [-(-k // self.n) for k in up]
        return [k // self.n for k in up]
