"""The regrouping that lets a batching change mid-run: a batching's state replayed.

A *batching change* (``load_state_dict(allow={"batch_size"})``: a new ``n`` or budget)
hands the new batching a state of the old one (a budget batching's, or a replay's);
:func:`open_upstream` turns it into a replay (a ``"regroup"`` state): the group's items not
yet given, in stream order, then the upstream on from the group's end. Nothing is given
twice, nothing is skipped. :func:`settled` is such a state past its group (its rest left
out): what an epoch's carry starts from.

An *elastic* resume (another world size or worker count) delivers the held groups too:
:func:`merge_held` folds every old worker's held groups (their items not given, each with
the old ``(rank, world, worker, workers, epoch)`` that read it) into a ``"held"`` state over
the upstream's merged one; the new ranks and workers share the groups out (group ``i`` to
slot ``i mod slots``) and each reads its groups again where they were read, gives their
items not yet given, then goes on with the re-planned rest of the epoch. Each item is
given once; none is left out. A mixture's exposure counts the groups' rest when it is given
(the merge takes the exposure the workers had given, :meth:`MixCursor.credit` the rest).

A load that leaves held samples out (a sources change) keeps their count (``dropped``) in a
``"regroup"`` state of no group over the worker's state, which every batching reads
(:func:`open_upstream`: counted in ``dropped_samples``) and saves again, so the count
survives a batching change, later loads and elastic merges (:func:`dropped_in`,
:func:`with_dropped`) to the epoch's end.

The group's given items are a bit mask in hex (``done``): :func:`bits`, :func:`mask`,
:func:`unmask`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardkit.errors import StateDictError
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Grid, Stage, check_int, check_state, state_epoch
from shardkit.stages.mix_draws import drawn_from
from shardkit.stages.mixture import given_in, mix_state
from shardkit.stages.nominal import share
from shardkit.stages.source import sources_of

__all__ = [
    "BATCHINGS",
    "HELD",
    "REGROUP",
    "bits",
    "dropped_in",
    "dropped_share",
    "held_groups",
    "held_rest",
    "left_after",
    "mask",
    "merge_held",
    "open_upstream",
    "settled",
    "unmask",
    "with_dropped",
]

REGROUP = "regroup"
HELD = "held"
BATCHINGS = ("budget_batched", REGROUP, HELD)


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
    """A batching's state past the groups it holds (their rest left out): what an epoch's
    carry starts from, and the upstream's part of an elastic merge (:func:`merge_held`
    keeps the groups)."""
    while state is not None and state.get("stage") in BATCHINGS:
        state = state.get("after", state.get("source"))
    return state


def held_groups(state: Mapping[str, Any] | None, at: list[int] | None) -> list[dict[str, Any]]:
    """The groups a batching's ``state`` holds (a budget batching's, a replay's, an elastic
    merge's), outermost first, each ``{"at", "source", "size", "done"}``: where it was read
    (``at``: the ``rank, world, worker, workers, epoch`` of the worker that read it, given as
    ``at`` for the state's own groups), the upstream's state before it, its item count and
    the items given (a hex bit mask)."""
    out: list[dict[str, Any]] = []
    while isinstance(state, Mapping) and state.get("stage") in BATCHINGS:
        name = str(state.get("stage"))
        if name == HELD:
            out += _check_groups(state)
            state = state.get("source")
        elif state.get("held", True) and "after" in state:
            st = check_state(state, name, 1, ("size", "done", "source"))
            size = check_int(st, name, "size")
            done = mask(unmask(st["done"], name))
            out.append({"at": at, "source": st["source"], "size": size, "done": done})
            state = state["after"]
        else:
            state = state.get("source")
    return out


def dropped_share(state: Mapping[str, Any], ctx: Context) -> int:
    """The held samples a load left out (``dropped``) that a batching's ``state`` counts for
    the worker ``ctx``: all, or its share where they are a merge's (``shared``)."""
    lost = check_int(state, str(state.get("stage")), "dropped")
    if not state.get("shared"):
        return lost
    return share(lost, ctx.world * ctx.workers, ctx.rank * ctx.workers + ctx.worker)


def dropped_in(grid: Grid) -> int:
    """The held samples loads left out that the batching states of ``grid`` count (each
    worker that gave nothing since a merge its share of the merge's)."""
    lost = 0
    for r, row in enumerate(grid):
        for w, st in enumerate(row):
            if st is not None and "dropped" in st:
                lost += dropped_share(st, Context(r, len(grid), w, len(row)))
    return lost


def with_dropped(state: dict[str, Any] | None, lost: int) -> dict[str, Any] | None:
    """``state`` (a merge's) carrying ``lost`` held samples left out, shared out by the new
    ranks and workers: in a batching's state of no group (``regroup``, size 0), which every
    batching reads (:func:`open_upstream`)."""
    if state is None or not lost:
        return state
    out = {"stage": REGROUP, "version": 1, "size": 0, "done": "", "source": state}
    return {**out, "dropped": lost, "shared": True}


def held_rest(state: Mapping[str, Any] | None, stage: str) -> int:
    """The items of the groups a batching's ``state`` holds that were not given."""
    rest = 0
    for g in held_groups(state, None):
        rest += max(g["size"] - len(unmask(g["done"], stage)), 0)
    return rest


def left_after(up: Stage, ctx: Context, state: Mapping[str, Any] | None, stage: str) -> int | None:
    """A batching's ``left``: its upstream's after the groups held, plus their items not
    given."""
    n = up.left(ctx, settled(state))
    return None if n is None else n + held_rest(state, stage)


def merge_held(up: Stage, grid: Grid) -> dict[str, Any] | None:
    """The elastic merge of a batching over ``up``: ``up``'s merge of the states past the
    groups held, and those groups (their items not given) in a ``"held"`` state the new
    ranks and workers share out. Without ``split_by_node`` every rank read the same
    stream, so the groups are rank 0's and each rank gives them all."""
    source = up.merge([[_delivered(st) for st in row] for row in grid])
    if source is None:
        return None
    by_node = _by_node(up)
    rows = grid if by_node else grid[:1]
    groups = []
    for r, row in enumerate(rows):
        for w, st in enumerate(row):
            if st is not None:
                at = [r, len(grid), w, len(row), state_epoch(st)]
                slots = len(grid) * len(row) if by_node else len(row)
                st = _own_share(st, r * len(row) + w if by_node else w, slots)
                groups += [g for g in held_groups(st, at) if _rest(g)]
    if not groups:
        return source
    return {"stage": HELD, "version": 1, "share": True, "groups": groups, "source": source}


def _own_share(state: Mapping[str, Any], slot: int, slots: int) -> Mapping[str, Any]:
    """A worker's ``state`` with an elastic merge's shared groups it still holds (it gave
    nothing since that load: its state is the load's, every group) cut to its own share,
    the part :func:`open_upstream` gave it (the others' are in the other workers' states)."""
    sub: Any = state
    while isinstance(sub, Mapping) and sub.get("stage") in BATCHINGS:
        if sub.get("stage") == HELD and sub.get("share"):
            break
        sub = sub.get("source")
    else:
        return state
    out = copy.deepcopy(dict(state))
    sub = out
    while not (sub.get("stage") == HELD and sub.get("share")):
        sub = sub["source"]
    sub["groups"] = _check_groups(sub)[slot::slots]
    sub.pop("share")
    return out


def _delivered(state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``state`` past its groups, its mixture's exposure what was given (the groups' rest,
    given after the merge, is counted then: :meth:`MixCursor.credit`)."""
    past = settled(state)
    mix = mix_state(past)
    if past is None or past is state or mix is None:
        return past
    start = mix_state(state)  # the mixture where the (outermost) group began
    if start is None or len(start.get("counts", ())) != len(mix.get("counts", ())):
        return past
    extra = given_in(state, len(mix["counts"]))  # what of the groups was given, by source
    pairs = zip(start["counts"], extra, strict=True)
    counts = [[int(c[0]) + e[0], int(c[1]) + e[1]] for c, e in pairs]
    out = copy.deepcopy(dict(past))
    inner = mix_state(out)
    if isinstance(inner, dict):
        inner["counts"] = counts
    return out


def _by_node(up: Stage) -> bool:
    return all(s.config.by_node for s in sources_of(up))


def _rest(group: Mapping[str, Any]) -> bool:
    return bool(group["size"] > len(unmask(group["done"], HELD)))


def _check_groups(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A ``"held"`` state's groups, checked (shapes and ranges)."""
    st = check_state(state, HELD, 1, ("groups", "source"))
    groups = st["groups"]
    if not isinstance(groups, list):
        raise StateDictError(f"{HELD}: key 'groups' must be a list")
    out = []
    for g in groups:
        if not isinstance(g, Mapping):
            raise StateDictError(f"{HELD}: every group must be a dict")
        check_int(g, HELD, "size")
        unmask(g.get("done"), HELD)
        at = g.get("at")
        ok = isinstance(at, list) and len(at) == 5 and all(type(x) is int and x >= 0 for x in at)
        if not isinstance(at, list) or not ok or not (0 <= at[0] < at[1] and 0 <= at[2] < at[3]):
            raise StateDictError(
                f"{HELD}: a group's 'at' must be [rank, world, worker, workers, epoch] "
                f"(ints >= 0, rank < world, worker < workers), got {at!r}"
            )
        if not isinstance(g.get("source"), Mapping):
            raise StateDictError(f"{HELD}: a group needs the upstream's state before it")
        out.append(dict(g))
    return out


def open_upstream(up: Stage, ctx: Context, state: Mapping[str, Any] | None) -> Cursor:
    """``up``'s cursor from ``state``: the upstream's own state, or a batching's (a budget
    batching's or a replay's, after a batching change), replayed: the items of its group
    not yet given, then on."""
    if state is None or state.get("stage") not in BATCHINGS:
        return up.iterate(ctx, state)
    if "dropped" in state:  # a load's count of held samples left out: kept, whatever batches
        inner = {k: v for k, v in state.items() if k not in ("dropped", "shared")}
        return _Dropped(open_upstream(up, ctx, inner), dropped_share(state, ctx))
    name = str(state.get("stage"))
    if name == HELD:
        groups = _check_groups(state)
        if state.get("share"):  # a merge's, for every new rank and worker: this one's part
            slots, slot = ctx.workers, ctx.worker
            if _by_node(up):
                slots, slot = ctx.world * ctx.workers, ctx.rank * ctx.workers + ctx.worker
            groups = groups[slot::slots]
        return _Held(up, open_upstream(up, ctx, state["source"]), groups)
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


class _Dropped(Cursor):
    """Its upstream, counting ``lost`` held samples a load left out (``dropped_samples``),
    kept in its state for the loads after (a batching of another kind or size reads it)."""

    def __init__(self, up: Cursor, lost: int) -> None:
        super().__init__(up)
        self.lost = lost
        self.own["dropped_samples"] = float(lost)
        self.items = up

    def state(self) -> dict[str, Any]:
        out = {"stage": REGROUP, "version": 1, "size": 0, "done": ""}
        return {**out, "source": self.upstream.state(), "dropped": self.lost}


class _Held(Cursor):
    """The items not given of ``groups`` (each read again where it was read: another rank
    and worker of the run that saved them), then on with ``up``."""

    def __init__(self, stage: Stage, up: Cursor, groups: list[dict[str, Any]]) -> None:
        super().__init__(up)
        self.stage = stage
        self.groups = groups
        self.mix = drawn_from(up)
        self.own["samples"] = 0.0
        self.items = self._items()

    def _items(self) -> Iterator[Any]:
        while self.groups:
            g = self.groups[0]
            where = Context(*g["at"])
            reader = open_upstream(self.stage, where, g["source"])
            self.upstreams.append(reader)  # its counters (bytes, seconds) are this cursor's
            drew = drawn_from(reader)
            done = bits(unmask(g["done"], HELD))
            n = 0
            for i, item in enumerate(itertools.islice(reader, g["size"])):
                n += 1
                self.own["samples"] -= 1  # counted when given (not at all: given before)
                if done >> i & 1:
                    continue
                done |= 1 << i
                self.groups[0] = {**g, "done": format(done, "x")}
                self.own["samples"] += 1
                if self.mix is not None and drew is not None and drew.last is not None:
                    self.mix.credit(drew.last, item)  # the merge left it out of the exposure
                yield item
            reader.close()
            if n < g["size"]:
                raise StateDictError(
                    f"{HELD}: a held group of {g['size']} items (read by rank {where.rank} "
                    f"worker {where.worker} of {where.world} x {where.workers}) has {n} read "
                    "again: the data or the pipeline differs from the run that saved it"
                )
            self.groups.pop(0)
        yield from self.upstream

    def state(self) -> dict[str, Any]:
        if not self.groups:  # every group given: the upstream's state is exact
            return self.upstream.state()
        groups = [dict(g) for g in self.groups]
        return {"stage": HELD, "version": 1, "groups": groups, "source": self.upstream.state()}
