"""The stage protocol: small iterators over an upstream, each able to give and take its cursor.

A stage's ``state_dict()`` describes everything it has *emitted* so far; it is valid
between two items the pipeline's last stage hands out. A stage without state of its own
returns its upstream's state unchanged (so adding a ``map`` does not change the format);
a stage with state nests its upstream's under ``"source"``::

    {"stage": "pack_tokens", "version": 1, "skip": 17, "source": {"stage": "shards", ...}}

``load_state_dict(state)`` is called before iteration and takes effect at the next
``iter()``; a state that does not fit raises :class:`StateDictError` naming the stage and key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardkit.errors import StateDictError

__all__ = ["Context", "Stage", "check_state", "merge_counters"]


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


def merge_counters(into: dict[str, float], more: Mapping[str, float]) -> None:
    """Add ``more``'s counters into ``into``."""
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


class Stage:
    """A pipeline stage over ``upstream`` (None for a source)."""

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

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def configure(self, ctx: Context) -> None:
        """Tell the sources where the pipeline runs (before ``iter``)."""
        for child in self.children():
            child.configure(ctx)

    def state_dict(self) -> dict[str, Any]:
        return self._up().state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._up().load_state_dict(state)

    def lengths(self, ctx: Context) -> list[int] | None:
        """Items each worker of ``ctx`` yields in an epoch (None when not known up front)."""
        return self._up().lengths(ctx)

    def counters(self) -> dict[str, float]:
        """Counters (samples, bytes, skips, ...) of this stage and everything upstream."""
        out: dict[str, float] = {}
        for child in self.children():
            merge_counters(out, child.counters())
        return out
