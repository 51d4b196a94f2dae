"""Batches filled to a cost budget.

``batched(budget=B, cost=...)`` reads its upstream in groups, each until it holds the cost
of ``GROUP_BATCHES`` (16) batches or ``buffer`` items, and packs each group into batches
whose cost is at most ``B`` (:func:`~shardkit.stages.costs.fill_to_budget`): the fewest
batches the group's cost allows, filled largest first into the least loaded batch, so that
every batch of a group carries about the same cost (a group of total cost ``T`` makes
``ceil(T / B)`` batches, each near ``T / ceil(T / B)``: at least 15/16 of ``B`` when the
items fit and the group is whole). An item costlier than ``B`` is a batch of its own. Every
rank fills its batches from its own stream, so the steps of the ranks cost about the same
with no data moved between them; the number of batches then differs by rank, and the
loader's shared epoch end (:mod:`shardkit.streaming.sync`) keeps the DDP contract: the epoch
ends for every rank when one rank's data ends (the rest of the others' is not given: each
item at most once).

``cost``: a field name or a callable (:mod:`shardkit.stages.costs`: what an item costs,
and the packing of costs into batches).

State, a cursor: the upstream's state before the group being given (``source``), its
item count (``size``), how many of its batches were given (``skip``) and which of its items
(``done``, a bit mask in hex).
A restore re-reads the group, packs it again and skips what was given. An elastic resume
gives the items the saved workers' groups held and had not given first, then goes on (see
:func:`~shardkit.stages.regroup.merge_held`): each item once, none left out.

A *batching change* (a new ``n`` or budget) replays the group's items not yet given:
see :mod:`shardkit.stages.regroup`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from typing import Any

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Grid, Stage, callable_name, check_int, check_state
from shardkit.stages.collate import collate_numpy
from shardkit.stages.costs import FieldCost, check_budget, cost_of, fill_to_budget
from shardkit.stages.mix_draws import drawn_from
from shardkit.stages.regroup import (
    bits,
    dropped_in,
    dropped_share,
    left_after,
    merge_held,
    open_upstream,
    settled,
    unmask,
)

__all__ = ["BudgetBatched"]

GROUP_BATCHES = 16
_END = object()


class BudgetBatched(Stage):
    """Batches of cost at most ``budget``, packed from groups of the cost of
    :data:`GROUP_BATCHES` batches (at most ``buffer`` items).

    Args:
        upstream: the stage before.
        budget: the most cost a batch holds (an item costlier is a batch of its own).
        cost: a field name (its element count) or ``item -> number``.
        buffer: the most items a group holds (fewer: less memory, emptier batches when a
            group ends before it holds the cost of 16 batches).
        collate: ``list[item] -> batch`` (numpy collation by default).
    """

    name = "budget_batched"
    version = 1

    def __init__(
        self,
        upstream: Stage,
        budget: float,
        cost: str | Callable[[Any], float],
        *,
        buffer: int = 1024,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__(upstream)
        budget = check_budget(budget)
        if type(buffer) is not int or buffer < 1:
            raise ConfigError(f"batched: buffer must be an int >= 1, got {buffer!r}")
        if isinstance(cost, str):
            cost = FieldCost(cost)
        elif not callable(cost):
            raise ConfigError(f"batched: cost must be a field name or a callable, not {cost!r}")
        self.budget = budget
        self.cost = cost
        self.buffer = buffer
        self.collate = collate or collate_numpy

    def cost_name(self) -> str:
        return repr(self.cost) if isinstance(self.cost, FieldCost) else callable_name(self.cost)

    def params(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "cost": self.cost_name(),
            "buffer": self.buffer,
            "collate": callable_name(self.collate),
        }

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if state is not None and state.get("stage") == self.name:
            st = check_state(state, self.name, self.version, ("skip", "done", "source"))
            skip = check_int(st, self.name, "skip")
            mine = (st.get("budget"), st.get("buffer"), st.get("cost"))
            if mine == (self.budget, self.buffer, self.cost_name()):
                done = bits(unmask(st["done"], self.name))
                up = open_upstream(self._up(), ctx, st["source"])
                cursor = _BudgetCursor(self, up, skip)
                if st.get("held", True):  # the group re-read must be the one saved
                    cursor.expect = (st.get("size"), done)
                if "dropped" in st:  # a load that left a group out (this worker's share)
                    cursor.own["dropped_samples"] = float(dropped_share(st, ctx))
                return cursor
        # none, the upstream's, or another batching's (a batching change): from there
        return _BudgetCursor(self, open_upstream(self._up(), ctx, state), 0)

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """The upstream's merge, with the items the workers' groups held and had not given
        (given first: :func:`~shardkit.stages.regroup.merge_held`)."""
        source = merge_held(self._up(), grid)
        if source is None:
            return None
        out = self._fresh(source)
        lost = dropped_in(grid)
        if lost:  # left out by a load and not counted yet: shared out by the new workers
            out.update(dropped=lost, shared=True)
        return out

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        source = self._up().carry(settled(state), epoch) if state is not None else None
        return None if source is None else self._fresh(source)

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        return None  # the batches a rank gets depend on the costs it reads

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        """The upstream's left after the groups held, plus their items not given."""
        return left_after(self._up(), ctx, state, self.name)

    def _fresh(self, source: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "stage": self.name,
            "version": self.version,
            "budget": self.budget,
            "buffer": self.buffer,
            "cost": self.cost_name(),
            "held": False,
            "size": 0,
            "skip": 0,
            "done": "",
            "source": dict(source),
        }


class _Group:
    """A group being read: its items and their costs, until they cost ``GROUP_BATCHES``
    budgets (an item costlier than the budget counts as one) or there are ``buffer``;
    ``before``/``after``: the upstream's states at its ends."""

    def __init__(self, stage: BudgetBatched, up: Cursor, cursor: _BudgetCursor) -> None:
        self.stage, self.up, self.cursor = stage, up, cursor
        self.sources: list[int | None] = []  # each item's mixture source (under a mixture)
        self.before = up.state()
        self.after: dict[str, Any] | None = None
        self.items: list[Any] = []
        self.costs: list[float] = []
        self.total = 0.0

    def read(self, n: int | None = None) -> _Group:
        """Read ``n`` more items (None: to the group's end)."""
        if self.after is not None:
            return self
        stage, up, items, costs = self.stage, self.up, self.items, self.costs
        cost, budget, most = stage.cost, stage.budget, stage.buffer
        mix, sources, own = self.cursor.mix, self.sources, self.cursor.own
        goal = GROUP_BATCHES * budget
        total = self.total
        left = -1 if n is None else n
        while left != 0:
            left -= 1
            item = next(up, _END)  # an item may be None
            if item is _END:
                self.after = up.state()
                break
            items.append(item)
            if mix is not None:
                sources.append(mix.last)
            own["samples"] -= 1  # counted when its batch is given
            c = cost_of(cost, item)
            costs.append(c)
            total += c if c < budget else budget
            if total >= goal or len(items) >= most:
                self.after = up.state()
                break
        self.total = total
        return self


class _BudgetCursor(Cursor):
    """Packs its upstream's groups into budget batches; holds the group being given.

    While it gives a group's batches it reads the next group a little before each (about
    as many items as a batch holds), so that every batch costs the worker about the same
    time: a whole group read at once would stall the loader's turn-taking workers.
    """

    def __init__(self, stage: BudgetBatched, up: Cursor, skip: int) -> None:
        super().__init__(up)
        self.stage = stage
        self.expect: tuple[Any, int] | None = None  # a restore's group: (size, done)
        self.held: dict[str, Any] | None = None
        self.clean = up.state()  # where a fresh cursor goes on when no group is held
        self.own["collate_s"] = 0.0
        # "samples": an item counts when its batch is given (held back from the source's
        # count while it waits in a group); a mixture's exposure is counted so too
        self.own["samples"] = 0.0
        self.mix = drawn_from(up)
        self.items = self._batches(skip)

    def state(self) -> dict[str, Any]:
        out = self.stage._fresh(self.clean)
        if self.held is not None:
            out.update(self.held, held=True)
        if self.own.get("dropped_samples"):  # a load's count, kept for the loads after
            out["dropped"] = int(self.own["dropped_samples"])
        return out

    def _batches(self, skip: int) -> Iterator[Any]:
        stage, collate = self.stage, self.stage.collate
        group = _Group(stage, self.upstream, self).read()
        while group.items:
            batches = fill_to_budget(group.costs, stage.budget)
            ahead = _Group(stage, self.upstream, self)
            per = -(-len(group.items) // len(batches))
            done = bits(i for b in batches[:skip] for i in b)
            if self.expect is not None:
                self._check_restored(len(group.items), len(batches), skip, done)
            given: dict[int, list[int]] = {}  # per mixture source: samples, tokens given
            for b in batches[:skip]:
                self._given(group, b, given)
            for k in range(skip, len(batches)):
                done |= bits(batches[k])
                self._given(group, batches[k], given)
                if k + 1 < len(batches):
                    self.held = {"source": group.before, "size": len(group.items)}
                    self.held.update(skip=k + 1, done=format(done, "x"), after=group.after)
                    if given:
                        self.held["given"] = [[s, *given[s]] for s in sorted(given)]
                else:  # the group is given: a fresh cursor reads the next one
                    self.held, self.clean = None, ahead.before
                t = perf_counter()
                out = collate([group.items[i] for i in batches[k]])
                self.own["collate_s"] += perf_counter() - t
                self.own["samples"] += len(batches[k])
                yield out
                ahead.read(per)
            skip = 0
            group = ahead.read()
        self.held, self.clean = None, group.after or self.upstream.state()

    def _check_restored(self, size: int, batches: int, skip: int, done: int) -> None:
        """The group a restore re-read packs as the one saved: else its batches would
        be given twice or skipped (a cost function changed under the same name, or a
        hand-edited state)."""
        want_size, want_done = self.expect or (size, done)
        self.expect = None
        if (want_size, want_done) != (size, done) or skip >= batches:
            raise StateDictError(
                f"{self.stage.name}: the group the state holds was saved with {want_size} "
                f"items, {skip} batches given (items {format(want_done, 'x')}); read again it "
                f"has {size} items in {batches} batches (items {format(done, 'x')}): the cost "
                f"{self.stage.cost_name()!r} or the data gives other costs than when it was "
                "saved (or the state was edited)"
            )

    def _given(self, group: _Group, batch: list[int], given: dict[int, list[int]]) -> None:
        """Add the items ``batch`` of ``group`` to ``given`` by mixture source."""
        if self.mix is None:
            return
        for i in batch:
            k = group.sources[i]
            if k is not None:
                got = given.setdefault(k, [0, 0])
                got[0] += 1
                got[1] += self.mix._tokens(group.items[i])
