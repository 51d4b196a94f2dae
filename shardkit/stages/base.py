"""The stage protocol: a stage is a recipe; iterating it makes a cursor.

A :class:`Stage` describes a step of a pipeline and holds no position: it is built once
(by the fluent methods), pickled to workers, and shared. ``stage.iterate(ctx, state)``
makes a :class:`Cursor`: the iterator of one epoch's part (``ctx``: rank, world, worker,
workers, epoch), which owns the position and starts at ``state`` (None: at the start). A
state is checked when the cursor is made; one that does not fit raises
:class:`StateDictError` naming the stage and key. Nothing is ever left "pending".

``cursor.state()`` describes everything the cursor has *emitted* so far; it is valid
between two items. A cursor without a position of its own returns its upstream's state
unchanged (so adding a ``map`` does not change the format); one with a position nests its
upstream's under ``"source"`` (or its upstreams' under ``"sources"``, a list)::

    {"stage": "pack_tokens", "version": 1, "skip": 17, "source": {"stage": "shards", ...}}

The protocol of a stage, each part in one place per stage:

- ``iterate(ctx, state)``: the cursor, restored and checked (type, sign, range);
- ``params()``: what its states fit (seed, buffer size, ``seq_len``...), gathered by
  :meth:`Stage.spec` into the pipeline's fingerprint, which a loaded state must match;
- ``merge(grid)``: for an elastic resume, the states of every ``(rank, worker)`` of the
  old run folded into one state that every new rank and worker starts from;
- ``lengths(ctx, state)``: items each worker yields in an epoch, when known up front.

A stage without a cursor of its own (``map``, ``select``, ``to_tuple``, ``batched``)
passes ``merge`` and ``lengths`` to its upstream and only adds its parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardkit.counters import add_counts
from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.world import Context

__all__ = [
    "Cursor",
    "Fruitless",
    "Grid",
    "Stage",
    "Step",
    "callable_name",
    "check_int",
    "check_state",
    "state_epoch",
    "sub_grid",
]

# The states of an old run, ``grid[rank][worker]``; None: a worker that had not started.
Grid = Sequence[Sequence[Mapping[str, Any] | None]]


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


def state_epoch(state: Any) -> int:
    """The epoch a pipeline state was saved in: its (first) source's ``epoch``, found down
    the ``"source"``/``"sources"`` nesting."""
    if not isinstance(state, Mapping):
        raise StateDictError(f"state must be a dict, got {type(state).__name__}")
    name = str(state.get("stage"))
    if "epoch" in state:
        return check_int(state, name, "epoch")
    if "source" in state:
        return state_epoch(state["source"])
    subs = state.get("sources")
    if isinstance(subs, list):
        for sub in subs:
            if sub is not None:
                return state_epoch(sub)
    raise StateDictError(f"{name}: the state holds no source state")


def sub_grid(grid: Grid, key: str) -> list[list[Mapping[str, Any] | None]]:
    """The nested states under ``key`` of every state of ``grid``."""
    return [[None if st is None else st[key] for st in row] for row in grid]


def callable_name(fn: Callable[..., Any]) -> str:
    """A stable name for user code in a fingerprint (module and qualified name)."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else str(name)


class Fruitless:
    """Items a stage drops in a row (a filter, a skip policy) over an endless upstream:
    past three passes over the upstream's data (at least 1,000) it names the stage in a
    ConfigError, as nothing would ever come (a finite upstream just ends).

    Args:
        what: the stage, as the message names it (``"select(is_code)"``).
        upstream: the stage it draws from (:meth:`Stage.endless` bounds it).
    """

    def __init__(self, what: str, upstream: Stage) -> None:
        self.what = what
        per_pass = upstream.endless()
        self.limit = None if per_pass is None else max(3 * per_pass, 1000)
        self.per_pass = per_pass
        self.run = 0

    def dropped(self) -> None:
        """One more item dropped."""
        self.run += 1
        if self.limit is not None and self.run >= self.limit:
            raise ConfigError(
                f"{self.what} dropped all {self.run} samples in a row of an endless stream "
                f"(3 passes over its {self.per_pass} samples): nothing would ever come; "
                "check the predicate or the data (or give the stream an end: with_epoch)"
            )

    def kept(self) -> None:
        """An item went on."""
        self.run = 0


class Cursor(Iterator[Any]):
    """One iteration of a stage: the items (``next``), and where it is (``state()``).

    A subclass sets ``items`` (usually a generator over its upstream cursors) and, when it
    has a position of its own, overrides :meth:`state`.
    """

    def __init__(self, *upstreams: Cursor) -> None:
        self.upstreams = list(upstreams)
        self.items: Iterator[Any] = iter(())
        self.own: dict[str, float] = {}  # this cursor's own counters (seconds, ...)

    @property
    def upstream(self) -> Cursor:
        return self.upstreams[0]

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> Any:
        return next(self.items)

    def state(self) -> dict[str, Any]:
        """What this cursor has emitted so far (a small, JSON-safe dict)."""
        return self.upstream.state()

    def close(self) -> None:
        """Stop reading (the files of an unfinished read close); the state stays valid."""
        close = getattr(self.items, "close", None)
        if close is not None:
            close()
        for up in self.upstreams:
            up.close()

    def counters(self) -> dict[str, float]:
        """Counters (samples, bytes, skips, ...) of this iteration, upstreams included."""
        out: dict[str, float] = {}
        for up in self.upstreams:
            add_counts(out, up.counters())
        if self.own:
            add_counts(out, self.own)
        return out


class Stage:
    """A pipeline stage over ``upstream`` (None for a source): a recipe, see the module
    docstring for its protocol."""

    name = "stage"

    def __init__(self, upstream: Stage | None) -> None:
        self.upstream = upstream

    def _up(self) -> Stage:
        if self.upstream is None:
            raise TypeError(f"{type(self).__name__} needs an upstream stage")
        return self.upstream

    def children(self) -> list[Stage]:
        """The stages this one reads from."""
        return [] if self.upstream is None else [self.upstream]

    def clone(self) -> Stage:
        """A copy of this stage and everything upstream (user code is shared, not copied),
        so pipelines built from one base never share a stage."""
        new = copy.copy(self)
        if self.upstream is not None:
            new.upstream = self.upstream.clone()
        return new

    def over(self, children: Sequence[Stage]) -> Stage:
        """This stage made again over ``children`` (for :meth:`children`; this one is
        unchanged)."""
        new = copy.copy(self)
        new.upstream = children[0] if children else None
        return new

    def rebuilt(self, swap: Callable[[Stage], Stage | None]) -> Stage:
        """The pipeline up to this stage made again where ``swap`` gives a stage a
        replacement (None: keep it), each stage above a replaced one made again over the
        new ones; none of the stages given is changed."""
        new = swap(self)
        if new is not None:
            return new
        children = self.children()
        made = [c.rebuilt(swap) for c in children]
        if all(m is c for m, c in zip(made, children, strict=True)):
            return self
        return self.over(made)

    def replacing(self, old: Stage, new: Stage) -> Stage:
        """The pipeline up to this stage with the stage ``old`` in it replaced by ``new``."""
        return self.rebuilt(lambda s: new if s is old else None)

    # -- the protocol ----------------------------------------------------------------
    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        """A cursor over ``ctx``'s part of ``ctx.epoch``, from ``state`` (None: the start)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The parameters a state of this stage fits (JSON-safe)."""
        return {}

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Fold every ``(rank, worker)`` state of an old run into one (None: nothing to
        resume from)."""
        return self._up().merge(grid)

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        """Items each worker of ``ctx`` yields in an epoch run from ``state`` (None: not
        known up front)."""
        return self._up().lengths(ctx, state)

    def endless(self) -> int | None:
        """None when the pipeline up to here ends on its own; else the samples of one pass
        over the data it draws from endlessly (a resampled source, a ``"never"`` mixture),
        which bounds how long a filter may drop everything (:class:`Fruitless`)."""
        return None if self.upstream is None else self.upstream.endless()

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        """Samples worker ``ctx`` has still to give this epoch from ``state`` (its pipeline
        state after the last item it delivered; None: from the start); None where not known
        (an endless or mixed pipeline)."""
        if self.upstream is None:
            return None
        if isinstance(state, Mapping) and state.get("stage") == self.name and "source" in state:
            state = state.get("after", state["source"])  # a stage with a position of its own
        return self.upstream.left(ctx, state)

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        """The state epoch ``epoch`` starts from when the epoch before ended (or was left) at
        ``state``: None, a fresh start, unless a stage keeps something across epochs (a
        mixture's exposure and progress, an endless mixture's cursors). A stage whose state
        is its upstream's passes it on; one with a state of its own and nothing to keep
        starts fresh."""
        if state is None or self.upstream is None or state.get("stage") == self.name:
            return None
        return self.upstream.carry(state, epoch)

    def spec(self) -> list[Any]:
        """The pipeline up to this stage, each stage's name and parameters in order: the
        fingerprint a state must match."""
        up = [] if self.upstream is None else self.upstream.spec()
        return [*up, {"stage": self.name, **self.params()}]


class Step(Stage):
    """A stage without a position of its own: its cursor's items are its upstream's,
    passed through :meth:`run`, and its state is its upstream's."""

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        up = self._up().iterate(ctx, state)
        cur = Cursor(up)
        cur.items = self.run(up)
        return cur

    def run(self, items: Iterator[Any]) -> Iterator[Any]:
        """The items of this stage, from its upstream's."""
        raise NotImplementedError
