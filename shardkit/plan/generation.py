"""A generation of an epoch: a run with some world size and worker count, the stream
positions each of its ``(rank, worker)`` streams had emitted and the shuffle window it used
(see :mod:`shardkit.plan.assign`'s elastic resume)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardkit.errors import StateDictError
from shardkit.plan.order import Window, stream_seed

__all__ = ["Generation", "shuffle_window"]


@dataclass(frozen=True)
class Generation:
    """A finished part of an epoch: a run with some world size and worker count, and how
    many stream positions each of its ``(rank, worker)`` streams had emitted.

    ``positions[rank][worker]``: ranks need not be in lockstep (a filter, packing, a
    skipped shard make them consume at different rates).
    """

    world: int
    workers: int
    positions: tuple[tuple[int, ...], ...]
    bufsize: int | None = None
    initial: int | None = None

    def __post_init__(self) -> None:
        rows = self.positions
        if len(rows) != self.world or any(len(r) != self.workers for r in rows):
            raise StateDictError(
                f"generation of {self.world} ranks x {self.workers} workers needs "
                f"{self.world} rows of {self.workers} positions"
            )
        for row in rows:
            for p in row:
                if type(p) is not int or p < 0:
                    raise StateDictError(f"generation: position {p!r} must be an int >= 0")

    def position(self, rank: int, worker: int) -> int:
        return self.positions[rank][worker]

    def consumed(self) -> int:
        """Stream positions emitted by every stream of the generation together."""
        return sum(sum(row) for row in self.positions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "workers": self.workers,
            "positions": [list(row) for row in self.positions],
            "bufsize": self.bufsize,
            "initial": self.initial,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Generation:
        """Read a history entry; a flat list of positions (shardkit <= 0.1: one per worker,
        the same on every rank) is read as that list on every rank."""
        try:
            world, workers = _count(raw["world"]), _count(raw["workers"])
            rows = raw["positions"]
            if not isinstance(rows, list):
                raise TypeError("positions must be a list")
            if rows and not isinstance(rows[0], list):
                rows = [rows] * world
            bufsize, initial = raw.get("bufsize"), raw.get("initial")
            return cls(
                world,
                workers,
                tuple(tuple(row) for row in rows),
                None if bufsize is None else _count(bufsize),
                None if initial is None else _count(initial),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateDictError(f"source state: bad history entry {raw!r}: {exc}") from None

    def window(self, seed: int, epoch: int, gen: int, rank: int, worker: int) -> Window | None:
        return shuffle_window(self.bufsize, self.initial, seed, epoch, gen, rank, worker)


def _count(x: Any) -> int:
    if type(x) is not int or x < 1:
        raise ValueError(f"{x!r} is not a positive int")
    return x


def shuffle_window(
    bufsize: int | None,
    initial: int | None,
    seed: int,
    epoch: int,
    gen: int,
    rank: int,
    worker: int,
) -> Window | None:
    """The shuffle window of one worker's stream (None: no shuffle)."""
    if bufsize is None or bufsize <= 1:
        return None
    return Window(bufsize, initial or bufsize, stream_seed(seed, epoch, gen, rank, worker))
