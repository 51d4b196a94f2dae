"""with_epoch: a nominal epoch of ``n`` items per rank over an endless (or long) pipeline.

The rank's ``n`` items are split over its workers (worker ``w`` of ``W`` yields
``n // W``, one more for ``w < n % W``), so every rank yields the same number of items
whatever the pipeline does, and the loader knows the epoch's length up front (the DDP
contract without a vote). After ``batched`` the items are batches. WebDataset's name.
A worker whose upstream ends before its share (a finite pipeline holding fewer than ``n``
items a rank, or an endless one with nothing left to give) raises a ConfigError: the
loader's length would be wrong.

State: the items this worker gave this epoch, with the upstream's state under
``"source"``. An elastic merge keeps what the ranks gave (the least of the ranks'
totals: they are equal in a job that kept the contract) and the new workers split the rest.
At the end of an epoch the upstream's state is carried into the next one (an endless
mixture goes on where it was).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Grid, Stage, check_int, check_state
from shardkit.values import as_int

__all__ = ["WithEpoch", "share"]

_END = object()


def share(n: int, workers: int, worker: int) -> int:
    """Worker ``worker``'s part of ``n`` items split over ``workers``."""
    return n // workers + (1 if worker < n % workers else 0)


class WithEpoch(Stage):
    """Yield ``n`` items per rank and epoch from ``upstream``.

    Args:
        upstream: the stage before.
        n: items per rank and epoch.
    """

    name = "with_epoch"
    version = 1

    def __init__(self, upstream: Stage, n: int) -> None:
        super().__init__(upstream)
        self.n = as_int(n, "with_epoch: n", low=1, floats=False)

    def params(self) -> dict[str, Any]:
        return {"n": self.n}

    def _quota(self, ctx: Context, st: Mapping[str, Any] | None) -> int:
        done = 0 if st is None or st.get("done") is None else int(st["done"])
        return share(max(self.n - done, 0), ctx.workers, ctx.worker)

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if state is None:
            return _EpochCursor(self, self._up().iterate(ctx), self._quota(ctx, None), 0, None)
        st = check_state(state, self.name, self.version, ("count", "source"))
        count = check_int(st, self.name, "count")
        done = st.get("done")
        if done is not None:
            check_int(st, self.name, "done")
        quota = self._quota(ctx, st)
        if count > quota:
            raise StateDictError(f"with_epoch: the state gave {count} items, the quota is {quota}")
        return _EpochCursor(self, self._up().iterate(ctx, st["source"]), quota, count, done)

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """The upstream merged; the items every rank gave so far (the least of them)."""
        source = self._up().merge(
            [[None if s is None else s["source"] for s in row] for row in grid]
        )
        given = [
            max((int(s.get("done") or 0) for s in row if s is not None), default=0)
            + sum(int(s["count"]) for s in row if s is not None)
            for row in grid
        ]
        if source is None:
            return None
        return self.state_of(0, min(given, default=0), source)

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        if state is None:
            return None
        source = self._up().carry(state["source"], epoch)
        if source is None:
            return None
        return self.state_of(0, None, source)

    def state_of(self, count: int, done: int | None, source: Any) -> dict[str, Any]:
        """A state: ``count`` items this worker gave, ``done`` the rank gave before."""
        return {
            "stage": self.name,
            "version": self.version,
            "count": count,
            "done": done,
            "source": source,
        }

    def endless(self) -> int | None:
        return None  # n items an epoch

    def left(self, ctx: Context, state: Mapping[str, Any] | None) -> int | None:
        return None  # its epoch is n items, not the samples its upstream holds

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        done = None if state is None else state.get("done")
        left = self.n - int(done or 0)
        return [share(max(left, 0), ctx.workers, w) for w in range(ctx.workers)]


class _EpochCursor(Cursor):
    def __init__(
        self, stage: WithEpoch, up: Cursor, quota: int, count: int, done: int | None
    ) -> None:
        super().__init__(up)
        self.stage = stage
        self.quota = quota
        self.count = count
        self.done = done
        self.items = self._run()

    def _run(self) -> Iterator[Any]:
        endless = self.stage._up().endless() is not None
        while self.count < self.quota:  # lengths() promised the quota
            item = next(self.upstream, _END)
            if item is _END:
                n, got, quota = self.stage.n, self.count, self.quota
                if endless:
                    raise ConfigError(
                        f"with_epoch({n}): the endless pipeline ran out after {got} of this "
                        f"worker's {quota} items (every source of the mixture is empty, or "
                        "holds nothing for this rank and worker): the loader's length would "
                        "be wrong"
                    )
                raise ConfigError(
                    f"with_epoch({n}): the pipeline ran out after {got} of this worker's "
                    f"{quota} items: it holds fewer than {n} items a rank, and the loader's "
                    "length would be wrong; give a smaller n, or an endless pipeline "
                    "(mix(..., stop='never'), resampled=True)"
                )
            self.count += 1
            yield item

    def state(self) -> dict[str, Any]:
        return self.stage.state_of(self.count, self.done, self.upstream.state())
