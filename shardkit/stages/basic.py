"""The stateless stages: map, select, to_tuple, batched (their cursor is their upstream's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from shardkit.errors import ConfigError, DecodeError
from shardkit.stages.base import Context, Stage, callable_name
from shardkit.stages.collate import collate_numpy

__all__ = ["Batched", "Map", "Select", "ToTuple"]


class Map(Stage):
    """Apply ``fn`` to every item."""

    name = "map"

    def __init__(self, upstream: Stage, fn: Callable[[Any], Any]) -> None:
        super().__init__(upstream)
        self.fn = fn

    def params(self) -> dict[str, Any]:
        return {"fn": callable_name(self.fn)}

    def __iter__(self) -> Iterator[Any]:
        fn = self.fn
        for item in self._up():
            yield fn(item)


class Select(Stage):
    """Keep the items for which ``predicate`` is true (the epoch length is then unknown)."""

    name = "select"

    def __init__(self, upstream: Stage, predicate: Callable[[Any], bool]) -> None:
        super().__init__(upstream)
        self.predicate = predicate

    def params(self) -> dict[str, Any]:
        return {"predicate": callable_name(self.predicate)}

    def __iter__(self) -> Iterator[Any]:
        pred = self.predicate
        for item in self._up():
            if pred(item):
                yield item

    def lengths(self, ctx: Context) -> list[int] | None:
        return None


class ToTuple(Stage):
    """Turn a sample dict into a tuple of fields; ``"jpg;png"`` takes the first present."""

    name = "to_tuple"

    def __init__(self, upstream: Stage, *fields: str) -> None:
        super().__init__(upstream)
        if not fields:
            raise ConfigError("to_tuple needs at least one field name")
        self.fields = [f.split(";") for f in fields]

    def params(self) -> dict[str, Any]:
        return {"fields": [";".join(f) for f in self.fields]}

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        fields = self.fields
        if all(len(f) == 1 for f in fields):
            names = [f[0] for f in fields]
            for sample in self._up():
                try:
                    yield tuple([sample[n] for n in names])
                except KeyError:
                    raise self._missing(sample) from None
            return
        for sample in self._up():
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


class Batched(Stage):
    """Group ``n`` items into one batch with ``collate`` (numpy collation by default).

    Args:
        upstream: the stage before.
        n: items per batch.
        collate: ``list[item] -> batch``.
        partial: yield a last batch of fewer than ``n`` items (else drop it).
    """

    name = "batched"

    def __init__(
        self,
        upstream: Stage,
        n: int,
        collate: Callable[[list[Any]], Any] | None = None,
        partial: bool = True,
    ) -> None:
        super().__init__(upstream)
        if n < 1:
            raise ConfigError(f"batch size must be at least 1, got {n}")
        self.n = n
        self.collate = collate or collate_numpy
        self.partial = partial

    def params(self) -> dict[str, Any]:
        return {"n": self.n, "partial": self.partial, "collate": callable_name(self.collate)}

    def __iter__(self) -> Iterator[Any]:
        n, collate = self.n, self.collate
        batch: list[Any] = []
        for item in self._up():
            batch.append(item)
            if len(batch) == n:
                yield collate(batch)
                batch = []
        if batch and self.partial:
            yield collate(batch)

    def lengths(self, ctx: Context) -> list[int] | None:
        up = self._up().lengths(ctx)
        if up is None:
            return None
        if self.partial:
            return [-(-k // self.n) for k in up]
        return [k // self.n for k in up]
