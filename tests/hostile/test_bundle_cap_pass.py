"""Hostile pass on the bundle cap published mid-epoch (0248540, c3471c3): worker processes'
bundles against thread workers, through the public API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
from torch.utils.data import get_worker_info

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest
from shardkit.streaming.bundles import BUNDLE_BYTES

MakeShards = Callable[..., Manifest]


def _slow(item: Any) -> Any:
    time.sleep(0.02)  # a healthy pipeline: a batch every 0.02 s, timeout=0.06 a batch
    return item


def _first_half(sample: dict[str, Any]) -> bool:
    return int(sample["__key__"][-6:]) < 20  # all of worker 0's samples, none of worker 1's


def test_a_later_epoch_waits_for_its_bundles_when_no_cap_was_published(
    make_shards: MakeShards,
) -> None:
    """Worker 1 has no batch, so no cap is published in epoch 0 and the persistent
    DataLoader iterator kept epoch 0's wait (timeout x 2); epoch 1 starts at the cap of the
    batches seen (16), and its bundle of 8 (0.16 s) failed a healthy pipeline with
    FetchError 'waited 0.96 s' in one mode only (threads give every batch)."""
    m = make_shards([40])
    ds = ShardDataset(m, seed=1).select(_first_half).decode().to_tuple("__key__", "tokens.npy")
    ds = ds.map(_slow).batched(1)
    threads = WebLoader(ds, num_workers=2, worker_mode="thread", timeout=0.06)
    procs = WebLoader(ds, num_workers=2, multiprocessing_context="fork", timeout=0.06)
    want = [list(b[0]) for b in threads]
    for epoch in (0, 1):
        procs.set_epoch(epoch)
        assert [list(b[0]) for b in procs] == want and len(want) == 20
    assert procs._mailbox.read()["bundle"] == 16  # the epoch really had big bundles


_made = [0]  # batches this process's pipeline made (a worker process has its own count)


def _grows(item: tuple[str, Any]) -> tuple[str, np.ndarray]:
    _made[0] += 1  # each worker's first bundles small, then 1 MiB a batch
    return item[0], np.zeros(1000 if _made[0] <= 4 else 1 << 20, np.uint8)


def test_batches_that_grow_after_the_first_bundles_size_the_next_epoch(
    make_shards: MakeShards,
) -> None:
    """Only each worker's first two bundles were measured: batches of 1 KB there and 1 MiB
    after them left the next epoch at bundles of 16 (16 MiB each: /tmp/h2/attack7's case so
    changed mapped 71.5 MiB of shared memory in epoch 1, 50.3 with this fix, 2 workers);
    every bundle's first batch now counts, so the next epoch starts at 3."""
    m = make_shards([12, 12])
    ds = ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").map(_grows)
    procs = WebLoader(ds.batched(1), num_workers=2, multiprocessing_context="fork")
    threads = WebLoader(ds.batched(1), num_workers=2, worker_mode="thread")
    for epoch in (0, 1):
        procs.set_epoch(epoch)
        threads.set_epoch(epoch)
        got = [list(b[0]) for b in procs]  # first: workers fork before threads count
        assert got == [list(b[0]) for b in threads] and len(got) == 24
    in_flight = 2 * (2 + 2)
    assert procs._mailbox.read()["bundle"] == BUNDLE_BYTES // in_flight // ((1 << 20) + 20)


def _every_seventh(sample: dict[str, Any]) -> bool:
    return int(sample["__key__"][-6:]) % 7 == 0  # workers' streams end at different batches


def _keys(loader: WebLoader, n: int | None = None) -> list[list[str]]:
    out: list[list[str]] = []
    for b in loader:
        out.append(list(b[0]))
        if len(out) == n:
            break
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_resume_is_exact_after_a_worker_ends_before_the_others(make_shards: MakeShards) -> None:
    """3 workers, a filter ending worker 0 two batches before the others: when its end was
    found at the turn after the last worker's, the turn skipped worker 1 (worker 2 went
    twice), so a resume (workers rotated: the ended one no longer last) handed out worker 1's
    batch before worker 2's, unlike the uninterrupted run, with threads and processes."""
    m = make_shards([7, 11, 3, 9, 13, 10, 7, 1, 2, 40, 5])
    ds = ShardDataset(m, seed=3).select(_every_seventh).decode().to_tuple("__key__", "tokens.npy")
    ds = ds.batched(2)
    threads = WebLoader(ds, num_workers=3, worker_mode="thread")
    threads.set_epoch(2)
    want = _keys(threads)
    assert len(want) == 9
    for mode, k in [("thread", k) for k in range(1, 9)] + [("process", 4), ("process", 9)]:
        kw: dict[str, Any] = {"worker_mode": mode, "multiprocessing_context": "fork"}
        if mode == "thread":
            kw.pop("multiprocessing_context")
        loader = WebLoader(ds, num_workers=3, **kw)
        loader.set_epoch(2)
        assert _keys(loader, k) == want[:k]
        resumed = WebLoader(ds, num_workers=3, **kw)
        resumed.load_state_dict(loader.state_dict())
        assert _keys(resumed) == want[k:], (mode, k)


_calls = [0, 0]  # this process's samples seen by the filter and by the map


def _worker_1_short(sample: dict[str, Any]) -> bool:
    _calls[0] += 1
    return cast(Any, get_worker_info()).id == 0 or _calls[0] <= 3


def _worker_1_ends_big(item: tuple[str, Any]) -> tuple[str, np.ndarray]:
    _calls[1] += 1
    first = cast(Any, get_worker_info()).id == 0
    if first and _calls[1] == 3:
        time.sleep(0.3)  # the training process waits for worker 0's item meanwhile
    big = not first and _calls[1] == 3  # worker 1's last batch: a new, bigger segment
    return item[0], np.zeros(1 << 21 if big else 10, np.uint8)


def test_a_worker_that_ended_and_exited_leaves_its_last_bundle_readable(
    make_shards: MakeShards,
) -> None:
    """Without persistent workers, worker 1's stream ends (3 batches, the last in a new
    2 MiB segment) while the training process waits for worker 0's: its stop arrives, torch
    tells it to exit, and its last bundle, still pickled, was loaded only at its turn: the
    segment's file descriptor was no longer there to fetch (FileNotFoundError from
    multiprocessing's resource_sharer, the epoch lost). Items are loaded as they arrive."""
    m = make_shards([10, 10])
    ds = ShardDataset(m, seed=1).select(_worker_1_short).decode().to_tuple("__key__", "tokens.npy")
    ds = ds.map(_worker_1_ends_big).batched(1)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork", persistent_workers=False)
    assert len(list(loader)) == 13
