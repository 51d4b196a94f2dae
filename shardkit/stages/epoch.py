"""Epoch: the cursor of a whole pipeline, as a data set reads it (the one iteration path of
:class:`~shardkit.ShardDataset` and of a loader's workers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from shardkit.stages.base import Cursor
from shardkit.stages.source import ShardSource

__all__ = ["Epoch"]


class Epoch(Cursor):
    """An iteration of a data set's pipeline: its items, its state, whether the epoch's
    part ended (``complete``). At the end every read still open stops (a shortest mix
    leaves some) and the sources release their prefetch leases."""

    def __init__(self, tail: Cursor, sources: Sequence[ShardSource], epoch: int) -> None:
        super().__init__(tail)
        self.sources = list(sources)
        self.epoch = epoch
        self.complete = False
        self.items = self._run()

    def _run(self) -> Iterator[Any]:
        yield from self.upstream
        self.complete = True
        self.upstream.close()
        for src in self.sources:  # the epoch is read: its prefetch leases go
            src.drain()
