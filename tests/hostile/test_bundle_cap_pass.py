"""Hostile pass on the bundle cap published mid-epoch (0248540, c3471c3): worker processes'
bundles against thread workers, through the public API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest

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
