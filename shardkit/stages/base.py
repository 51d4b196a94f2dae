"""The stage protocol: small iterators over an upstream, each able to give and take its cursor.

A stage's ``state_dict()`` describes everything it has *emitted* so far; it is valid
between two items the pipeline's last stage hands out. A stage without state of its own
returns its upstream's state unchanged (so adding a ``map`` does not change the format);
a stage with state nests its upstream's under ``"source"``::

    {"stage": "pack_tokens", "version": 1, "skip": 17, "source": {"stage": "shards", ...}}

``load_state_dict(state)`` is called before iteration (after :meth:`Stage.configure`) and
takes effect at the next ``iter()``; a state that does not fit raises
:class:`StateDictError` naming the stage and key. Until then the stage holds it as
*pending* (:meth:`Stage._take_pending`), and ``state_dict()`` gives it back unchanged.

Each stage owns its whole resume story here, in one place:

- ``state_dict`` / ``load_state_dict``: its cursor (checked: type, sign, range);
- ``params``: what its state fits (seed, buffer size, ``seq_len``...), gathered by
  :meth:`Stage.spec` into the pipeline's fingerprint, which a loaded state must match;
- ``merge``: for an elastic resume, the states of every ``(rank, worker)`` of the old run
  folded into one state that every new rank and worker loads;
- ``state_epoch``: the epoch a state is for.

A stage without a cursor of its own (``map``, ``select``, ``to_tuple``, ``batched``)
passes all of these to its upstream and only adds its parameters to the fingerprint.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.counters import add_counts
from shardkit.errors import StateDictError

__all__ = [
    "Context",
    "Grid",
    "Stage",
    "callable_name",
    "check_int",
    "check_state",
    "sub_grid",
]

# The states of an old run, ``grid[rank][worker]``; None: a worker that had not started.
Grid = Sequence[Sequence[Mapping[str, Any] | None]]


@dataclass(frozen=True)
class Context:
    """Where a pipeline runs: the epoch, this rank in the world, this worker among workers."""

    epoch: int = 0
    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1


def check_state(state: Any, stage: str, version: int, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check that ``state`` is this stage's, of this version, with ``keys``; return it."""
    if not isinstance(state, Mapping):
        raise StateDictError(f"{stage}: state must be a dict, got {type(state).__name__}")
    found = state.get("stage")
    if found != stage:
        raise StateDictError(
            f"{stage}: the state is for stage {found!r}: the pipeline differs from the one "
            "that saved it"
        )
    if state.get("version") != version:
        raise StateDictError(
            f"{stage}: state version {state.get('version')!r} is not supported (this "
            f"shardkit reads version {version})"
        )
    for key in keys:
        if key not in state:
            raise StateDictError(f"{stage}: the state has no key {key!r}")
    return dict(state)


def check_int(state: Mapping[str, Any], stage: str, key: str, low: int = 0) -> int:
    """``state[key]`` as an int ``>= low`` (bools and floats refused)."""
    value = state.get(key)
    if type(value) is not int or value < low:
        raise StateDictError(f"{stage}: key {key!r} must be an int >= {low}, got {value!r}")
    return value


def sub_grid(grid: Grid, key: str) -> list[list[Mapping[str, Any] | None]]:
    """The nested states under ``key`` of every state of ``grid``."""
    return [[None if st is None else st[key] for st in row] for row in grid]


def callable_name(fn: Callable[..., Any]) -> str:
    """A stable name for user code in a fingerprint (module and qualified name)."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else str(name)


class Stage:
    """A pipeline stage over ``upstream`` (None for a source)."""

    name = "stage"

    def __init__(self, upstream: Stage | None) -> None:
        self.upstream = upstream
        self._pending: dict[str, Any] | None = None

    def _up(self) -> Stage:
        if self.upstream is None:
            raise TypeError(f"{type(self).__name__} needs an upstream stage")
        return self.upstream

    def clone(self) -> Stage:
        """A copy of this stage and everything upstream (user code is shared, not copied):
        pipelines built from one base never share a stage."""
        new = copy.copy(self)
        new._pending = None
        if self.upstream is not None:
            new.upstream = self.upstream.clone()
        return new

    def children(self) -> list[Stage]:
        """The stages this one reads from."""
        return [] if self.upstream is None else [self.upstream]

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def configure(self, ctx: Context) -> None:
        """Tell the sources where the pipeline runs (before ``iter``)."""
        for child in self.children():
            child.configure(ctx)

    # -- the resume protocol ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the pipeline has emitted so far (a cursor, JSON-safe)."""
        return self._up().state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter()``."""
        self._up().load_state_dict(state)

    def clear_state(self) -> None:
        """Forget a loaded state that was not used (the next ``iter()`` starts fresh)."""
        self._pending = None
        for child in self.children():
            child.clear_state()

    def _take_pending(self) -> dict[str, Any] | None:
        """The loaded state, once: an ``iter()`` applies it and later ones start fresh."""
        st, self._pending = self._pending, None
        return st

    def params(self) -> dict[str, Any]:
        """The parameters a state of this stage fits (JSON-safe)."""
        return {}

    def spec(self) -> list[Any]:
        """The pipeline up to this stage: each stage's name and parameters, in order."""
        return [*self._up().spec(), {"stage": self.name, **self.params()}]

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Fold every ``(rank, worker)`` state of an old run into one (None: nothing to
        resume from)."""
        return self._up().merge(grid)

    def state_epoch(self, state: Mapping[str, Any]) -> int:
        """The epoch ``state`` was saved in."""
        return self._up().state_epoch(state)

    def lengths(self, ctx: Context) -> list[int] | None:
        """Items each worker of ``ctx`` yields in an epoch (None when not known up front)."""
        return self._up().lengths(ctx)

    def counters(self) -> dict[str, float]:
        """Counters (samples, bytes, skips, ...) of this stage and everything upstream."""
        out: dict[str, float] = {}
        for child in self.children():
            add_counts(out, child.counters())
        return out
