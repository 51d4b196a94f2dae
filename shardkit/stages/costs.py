"""What an item costs, and costs into batches: the pure part of
``batched(budget=B, cost=...)`` (:mod:`shardkit.stages.budget` reads the groups and keeps
the state).

``cost``: a field name counts that field's elements (:class:`FieldCost`: an array's
``size``, a list's length, raw bytes' length before ``decode``); a callable gives any number
(:func:`attention_cost`: the sum of squared document lengths of a packed sequence, from its
``cu_seqlens``). :func:`fill_to_budget` packs a group's costs into the fewest batches of cost
at most the budget, filled largest first into the least loaded batch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, DecodeError
from shardkit.stages.base import callable_name

__all__ = [
    "FieldCost",
    "attention_cost",
    "check_budget",
    "cost_of",
    "fill_to_budget",
    "item_key",
]


class FieldCost:
    """The cost of a sample: the number of elements of its field ``field`` (bytes: their
    length)."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, sample: Any) -> float:
        try:
            value = sample[self.field]
        except (KeyError, TypeError, IndexError):
            raise DecodeError(
                f"batched(budget=): cost={self.field!r} needs samples (dicts) holding that "
                f"field, got {type(sample).__name__}: batch before to_tuple(), or give "
                "cost= a callable",
                key=item_key(sample),
            ) from None
        if type(value) is np.ndarray:  # the common case, first
            return float(value.size)
        numel = getattr(value, "numel", None)  # a tensor (its size is a method)
        if callable(numel):
            return float(numel())
        size = getattr(value, "size", None)  # a numpy array or scalar
        if isinstance(size, int):
            return float(size)
        if isinstance(value, (bytes, bytearray, memoryview, str, list, tuple)):
            return float(len(value))
        raise DecodeError(
            f"batched(budget=): cost={self.field!r} counts the elements of an array, list or "
            f"bytes, got {type(value).__name__}: give cost= a callable",
            key=item_key(sample),
        )

    def __repr__(self) -> str:
        return f"field:{self.field}"


def item_key(sample: Any) -> str | None:
    return str(sample.get("__key__")) if isinstance(sample, Mapping) else None


def cost_of(cost: Callable[[Any], Any], item: Any) -> float:
    """``cost(item)``, a finite number >= 0 (not a bool or a string), else a DecodeError
    naming the item and the cost."""
    c = cost(item)
    if type(c) is float and 0.0 <= c < math.inf:  # the common case, checked cheaply
        return c
    ok = isinstance(c, int | float | np.integer | np.floating) and not isinstance(
        c, bool | np.bool_
    )
    value = float(c) if ok else math.nan
    if not (math.isfinite(value) and value >= 0):
        name = repr(cost) if isinstance(cost, FieldCost) else callable_name(cost)
        raise DecodeError(
            f"batched(budget=): cost {name} gave {c!r}: a cost must be a finite number >= 0",
            key=item_key(item),
        )
    return value


def check_budget(budget: Any) -> float | int:
    """``budget`` as a Python number: finite and > 0 (numpy numbers taken, bools not)."""
    ok = isinstance(budget, int | float | np.integer | np.floating) and not isinstance(
        budget, bool | np.bool_
    )
    if not ok or not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"batched: budget must be a finite number > 0, got {budget!r}")
    value: float | int = budget.item() if isinstance(budget, np.generic) else budget
    return value


def attention_cost(sample: Mapping[str, Any]) -> float:
    """The attention cost of a packed sequence (``pack_tokens(..., boundaries=True)``): the
    sum of its documents' squared lengths, from ``cu_seqlens``."""
    runs = np.diff(np.asarray(sample["cu_seqlens"], dtype=np.int64))
    return float(np.dot(runs, runs))


def fill_to_budget(costs: Sequence[float], budget: float) -> list[list[int]]:
    """Pack items of ``costs`` into batches of cost at most ``budget``.

    An item costlier than ``budget`` is a batch of its own. The others go, largest first
    (ties: the earlier), into the least loaded of ``k`` batches, ``k`` the fewest their
    total allows (one more while an item does not fit). Returns the batches as lists of
    item indices in input order, ordered by their first item; a pure function of the costs.
    """
    alone = [[i] for i, c in enumerate(costs) if c > budget]
    # largest first, ties in input order (a reversed sort keeps equal keys in order)
    rest = sorted(range(len(costs)), key=costs.__getitem__, reverse=True)
    if alone:
        rest = [i for i in rest if costs[i] <= budget]
    bins: list[list[int]] = []
    if rest:
        total = sum(costs[i] for i in rest)
        # in budgets (finite costs near 1e308 sum past a float: each in budgets first)
        ratio = total / budget if total < math.inf else sum(costs[i] / budget for i in rest)
        k = max(1, math.ceil(ratio - 1e-9))
        while True:
            bins = _spread(costs, rest, budget, k)
            if bins:
                break
            k += 1
    out = [sorted(b) for b in bins if b] + alone
    out.sort(key=lambda b: b[0])
    return out


def _spread(costs: Sequence[float], order: list[int], budget: float, k: int) -> list[list[int]]:
    """``order``'s items into the least loaded of ``k`` batches; [] when one does not fit."""
    heap = [(0.0, b) for b in range(min(k, len(order)))]
    bins: list[list[int]] = [[] for _ in heap]
    for i in order:
        load, b = heap[0]
        load += costs[i]
        if load > budget:
            return []
        bins[b].append(i)
        heapq.heapreplace(heap, (load, b))
    return bins
