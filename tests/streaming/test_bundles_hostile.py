"""Hostile pass on worker processes' bundles (:mod:`shardkit.streaming.bundles`): what a
user sees through WebLoader that thread workers do not show."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.errors import FetchError, TransferError
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


BAD = "sample-00000011"  # in worker 1's stream, mid-bundle (SIZES, seed 1, 2 workers)
SIZES = [7, 11, 3, 9, 13, 10, 7, 1, 2]


def _fails(items: list[Any]) -> list[Any]:
    keys = [k for k, _ in items]
    if BAD in keys:
        raise ValueError(f"a batch with {BAD}")
    return [keys]


def _cannot_cross(items: list[Any]) -> list[Any]:
    keys = [k for k, _ in items]
    return [keys, threading.Lock()] if BAD in keys else [keys]


def _run(ds: ShardDataset, mode: str) -> tuple[list[str], BaseException | None]:
    got: list[str] = []
    kw: dict[str, Any] = {"multiprocessing_context": "fork", "timeout": 30}
    try:
        for b in WebLoader(
            ds, num_workers=2, worker_mode=mode, **(kw if mode == "process" else {})
        ):
            got.append(b[0][0])
    except (ValueError, TransferError) as exc:
        return got, exc
    return got, None


def _samples(m: Manifest, collate: Callable[[list[Any]], Any]) -> ShardDataset:
    return ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").batched(1, collate)


def test_an_error_in_a_later_worker_comes_after_the_batches_threads_give(
    make_shards: MakeShards,
) -> None:
    """Worker 1's bundle cut by its error: the training process took worker 0's next bundle,
    due before worker 1's error item, as the sign that worker 1 had ended, and handed out
    worker 0's batches (9 more than threads) before the error, out of threads' order."""
    m = make_shards(SIZES)
    want, error = _run(_samples(m, _fails), "thread")
    got, raised = _run(_samples(m, _fails), "process")
    assert error is not None and raised is not None and BAD in str(raised)
    assert got == want and len(want) > 8


def test_a_batch_that_cannot_cross_mid_bundle_comes_after_the_batches_before_it(
    make_shards: MakeShards,
) -> None:
    """The bundle holding a batch that cannot be pickled failed whole: the batches before it
    in that bundle (16 here) were never handed out, and the TransferError came early."""
    m = make_shards(SIZES)
    full, _ = _run(_samples(m, lambda items: [[k for k, _ in items]]), "thread")
    got, raised = _run(_samples(m, _cannot_cross), "process")
    assert isinstance(raised, TransferError)
    assert got == full[: full.index(BAD)]
