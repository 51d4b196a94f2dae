"""The regrouping that lets a batching change mid-run: a batching's state replayed.

A *batching change* (``load_state_dict(allow={"batch_size"})``: a new ``n`` or budget)
hands the new batching a state of the old one (a budget batching's, or a replay's);
:func:`open_upstream` turns it into a replay (a ``"regroup"`` state): the group's items not
yet given, in stream order, then the upstream on from the group's end. Nothing is given
twice, nothing is skipped. :func:`settled` is such a state past its group (its rest left
out): what an elastic merge and an epoch's carry start from.

The group's given items are a bit mask in hex (``done``): :func:`bits`, :func:`mask`,
:func:`unmask`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardkit.errors import StateDictError
from shardkit.stages.base import Context, Cursor, Stage, check_int, check_state
from shardkit.stages.mix_draws import drawn_from

__all__ = ["BATCHINGS", "REGROUP", "bits", "mask", "open_upstream", "settled", "unmask"]

REGROUP = "regroup"
BATCHINGS = ("budget_batched", REGROUP)


def bits(done: Iterable[int]) -> int:
    """Item positions as a bit mask."""
    bits = 0
    for i in done:
        bits |= 1 << i
    return bits


def mask(done: Iterable[int]) -> str:
    """Item positions as a hex bit mask."""
    return format(bits(done), "x")


def unmask(text: Any, stage: str) -> set[int]:
    if not isinstance(text, str):
        raise StateDictError(f"{stage}: key 'done' must be a hex string")
    try:
        bits = int(text or "0", 16)
    except ValueError:
        raise StateDictError(f"{stage}: key 'done' must be a hex string") from None
    return {i for i in range(bits.bit_length()) if bits >> i & 1}


def settled(state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A batching's state past the group it holds (its rest left out): what an elastic
    merge and an epoch's carry start from."""
    while state is not None and state.get("stage") in BATCHINGS:
        state = state.get("after", state.get("source"))
    return state


def open_upstream(up: Stage, ctx: Context, state: Mapping[str, Any] | None) -> Cursor:
    """``up``'s cursor from ``state``: the upstream's own state, or a batching's (a budget
    batching's or a replay's, after a batching change), replayed: the items of its group
    not yet given, then on."""
    if state is None or state.get("stage") not in BATCHINGS:
        return up.iterate(ctx, state)
    name = str(state.get("stage"))
    st = check_state(state, name, 1, ("size", "done", "source"))
    size = check_int(st, name, "size")
    done = unmask(st["done"], name)
    if name == "budget_batched" and not st.get("held", True):  # no group held
        return open_upstream(up, ctx, st["source"])
    replay = _Replay(open_upstream(up, ctx, st["source"]), size, done, st["source"])
    replay.after = st.get("after")  # known before the group is read again
    return replay


class _Replay(Cursor):
    """The items of a group (``size`` items from ``before``) not in ``done``, then on."""

    def __init__(self, up: Cursor, size: int, done: set[int], before: Mapping[str, Any]) -> None:
        super().__init__(up)
        # a copy of its own: the upstream's cursor may change the state it started from
        self.size, self.done, self.before = size, set(done), copy.deepcopy(dict(before))
        self.after: dict[str, Any] | None = None
        self.mix = drawn_from(up)
        self.group: list[Any] = []
        self.sources: list[int | None] = []  # each group item's mixture source
        self.own["samples"] = 0.0
        self.items = self._replay()

    def _replay(self) -> Iterator[Any]:
        for item in itertools.islice(self.upstream, self.size):
            self.group.append(item)
            self.sources.append(None if self.mix is None else self.mix.last)
            self.own["samples"] -= 1  # counted when given (not at all: given before)
        self.after = self.upstream.state()
        for i, item in enumerate(self.group):
            if i not in self.done:
                self.done.add(i)
                self.own["samples"] += 1
                yield item
        self.size, self.group = 0, []
        yield from self.upstream

    def state(self) -> dict[str, Any]:
        if self.size == 0:  # the group was given: the upstream's state is exact
            return self.upstream.state()
        out = {"stage": REGROUP, "version": 1, "size": self.size, "done": mask(self.done)}
        out["source"] = self.before
        if self.after is not None:
            out["after"] = self.after
        if self.mix is not None and self.group:  # what of the group was delivered, by source
            given: dict[int, list[int]] = {}
            for i in self.done:
                k = self.sources[i]
                if k is not None:
                    got = given.setdefault(k, [0, 0])
                    got[0] += 1
                    got[1] += self.mix._tokens(self.group[i])
            out["given"] = [[k, *given[k]] for k in sorted(given)]
        return out
