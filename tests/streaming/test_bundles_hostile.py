"""Hostile pass on worker processes' bundles (:mod:`shardkit.streaming.bundles`): what a
user sees through WebLoader that thread workers do not show."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.errors import FetchError
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]


def _slow(item: Any) -> Any:
    time.sleep(0.03)  # a healthy pipeline: a batch every 0.03 s, well within timeout
    return item


def _keys(loader: WebLoader) -> list[list[str]]:
    return [list(b[0]) for b in loader]


def test_timeout_is_a_batchs_not_a_bundles(make_shards: MakeShards) -> None:
    """timeout=0.2 with a batch made every 0.03 s: thread workers give every batch; worker
    processes gave up at the first bundle of 8 (0.24 s) with torch's 'DataLoader timed out
    after 0.2 seconds', a failure of a healthy pipeline in one mode only."""
    m = make_shards([20, 20])
    ds = ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").map(_slow).batched(1)
    want = _keys(WebLoader(ds, num_workers=2, worker_mode="thread", timeout=0.2))
    got = _keys(WebLoader(ds, num_workers=2, multiprocessing_context="fork", timeout=0.2))
    assert got == want and len(got) == 40


def _stuck(item: Any) -> Any:
    if str(item[0]).endswith("05"):
        time.sleep(1.2)  # a worker that hangs (as long as the test can wait for its exit)
    return item


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_worker_that_hangs_is_a_fetch_error_naming_the_timeout(
    make_shards: MakeShards, mode: str
) -> None:
    m = make_shards([8])
    ds = ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").map(_stuck)
    loader = WebLoader(ds.batched(1), num_workers=1, worker_mode=mode, timeout=0.05)
    t = time.monotonic()
    with pytest.raises(FetchError, match=r"timeout=0\.05"):
        _keys(loader)
    assert time.monotonic() - t < 2.5  # 16 bundles' timeouts at most, and the worker's exit
