"""A loader dropped unfinished stops its stall watch and its worker processes: before, an
epoch never started (``iter(loader)`` alone) left both running until the process exited,
and the watch reported its 300 s stall into a later test's log."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest

pytestmark = pytest.mark.integration


def _gone(things: Callable[[], set[object]], within: float = 5.0) -> bool:
    until = time.monotonic() + within
    while things() and time.monotonic() < until:
        time.sleep(0.05)
    return not things()


@pytest.mark.parametrize(
    ("workers", "started"), [(2, False), (2, True), (0, False)], ids=["never", "left", "main"]
)
def test_a_loader_dropped_unfinished_stops_its_watch_and_workers(
    make_shards: Callable[..., Manifest], workers: int, started: bool
) -> None:
    m = make_shards([4, 4, 4])
    ds = ShardDataset(str(Path(m.base or "") / "manifest.json")).batched(2)
    children, threads = set(multiprocessing.active_children()), set(threading.enumerate())
    loader = WebLoader(ds, num_workers=workers, multiprocessing_context="fork" if workers else None)
    gc.disable()  # the drop itself must stop them, not a later collection
    try:
        it = iter(loader)
        if started:
            next(it)

        def ours() -> set[object]:
            return set(multiprocessing.active_children()) - children

        def watches() -> set[object]:
            new = set(threading.enumerate()) - threads
            return {t for t in new if t.name == "shardkit-stall"}

        assert len(ours()) == workers and len(watches()) == 1
        del it, loader
        assert _gone(watches), "the stall watch outlived its loader"
        assert _gone(ours), "the worker processes outlived their loader"
    finally:
        gc.enable()
