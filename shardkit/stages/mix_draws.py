"""The draws of a mixture: the cursor that picks, draw by draw, which source gives the next
item (see :mod:`shardkit.stages.mixture` for the rule and the state it keeps)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from shardkit.plan.order import stream_seed, uniforms
from shardkit.plan.schedule import Schedule, choose
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Stage

__all__ = ["MixCursor", "Mixed", "drawn_from"]

_BLOCK = 1024
_END = object()


class Mixed(Protocol):
    """What the draws read of a mixture recipe (:class:`shardkit.stages.mixture.Mix`)."""

    stages: list[Stage]
    schedule: Schedule
    seed: int
    stop: str
    tokens_field: str | None


def drawn_from(cursor: Cursor) -> MixCursor | None:
    """The mixture cursor a cursor reads from (None: none): its ``last`` is the source of
    the item that came out of it last."""
    found: Cursor | None = cursor
    while found is not None:
        if isinstance(found, MixCursor):
            return found
        found = found.upstreams[0] if found.upstreams else None
    return None


class MixCursor(Cursor):
    """Draws which source cursor gives the next item; restarts a source under ``"never"``."""

    def __init__(self, stage: Mixed, ctx: Context, st: dict[str, Any]) -> None:
        self.stage = stage
        self.ctx = ctx
        self.st = st
        ups = [
            s.iterate(self._at(k), sub)
            for k, (s, sub) in enumerate(zip(stage.stages, st["sources"], strict=True))
        ]
        super().__init__(*ups)
        self.scale = ctx.world * ctx.workers
        self._block = (-2 * _BLOCK, np.empty(0))  # no block yet
        self.last: int | None = None  # the source of the item given last
        self.items = self._mix()

    def _at(self, k: int) -> Context:
        """Where source ``k`` runs: this rank and worker, in its own epoch."""
        c = self.ctx
        return Context(c.rank, c.world, c.worker, c.workers, int(self.st["epochs"][k]))

    def _uniform(self, t: int) -> float:
        """Draw ``t``'s uniform (a pure function of ``t``, computed in blocks)."""
        first, block = self._block
        if not first <= t < first + _BLOCK:
            c, st = self.ctx, self.st
            # under "never" the epochs are nominal: one draw stream from where it began
            epoch = int(st.get("origin", 0)) if self.stage.stop == "never" else c.epoch
            seed = stream_seed(self.stage.seed, epoch, st["generation"], c.rank, c.worker, 0x313)
            first = t - t % _BLOCK
            block = uniforms(seed, np.arange(first, first + _BLOCK, dtype=np.int64))
            self._block = (first, block)
        return float(block[t - first])

    def _progress(self) -> float:
        unit = 1 if self.stage.schedule.unit == "tokens" else 0
        return float(self.st["base"][unit] + self.st["taken"][unit] * self.scale)

    def _tokens(self, item: Any) -> int:
        field = self.stage.tokens_field
        if field is None or not isinstance(item, Mapping) or field not in item:
            return 0
        return len(item[field])

    def _next_of(self, k: int) -> Any:
        """Source ``k``'s next item; under ``"never"`` from its next epoch when it ran out
        (a source that has nothing in a fresh epoch is out for good)."""
        item = next(self.upstreams[k], _END)
        if item is not _END or self.stage.stop != "never":
            return item
        self.st["epochs"][k] += 1
        self.upstreams[k] = self.stage.stages[k].iterate(self._at(k))
        return next(self.upstreams[k], _END)

    def _mix(self) -> Iterator[Any]:
        st, stage = self.st, self.stage
        out = st["exhausted"]
        schedule = stage.schedule
        while not (stage.stop == "first" and any(out)):
            k = choose(
                self._uniform(st["draws"]),
                schedule.weights_at(self._progress()),
                [not x for x in out],
            )
            if k is None:
                return
            st["draws"] += 1
            item = self._next_of(k)
            if item is _END:
                out[k] = True
                continue
            n = self._tokens(item)
            st["taken"][0] += 1
            st["taken"][1] += n
            st["counts"][k][0] += 1
            st["counts"][k][1] += n
            self.last = k
            yield item

    def credit(self, k: int, item: Any) -> None:
        """Count ``item`` of source ``k`` in the exposure: drawn by another cursor (a held
        group's item given after an elastic resume, whose merge left it out)."""
        self.st["counts"][k][0] += 1
        self.st["counts"][k][1] += self._tokens(item)
        self.last = k

    def state(self) -> dict[str, Any]:
        st = dict(self.st)  # its values are ints, names, or lists of ints: copied one deep
        for key in ("taken", "base", "exhausted", "epochs", "names"):
            st[key] = list(st[key])
        st["counts"] = [list(c) for c in st["counts"]]
        st["sources"] = [up.state() for up in self.upstreams]
        st["scale"] = self.scale
        return st
