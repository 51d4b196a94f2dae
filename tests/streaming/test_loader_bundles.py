"""Worker processes send their batches in bundles (:mod:`shardkit.streaming.bundles`): the
training loop still gets them one at a time, in thread workers' order, resumable after any
batch (mid-bundle too); an error made mid-bundle comes after every batch before it; leaving
an epoch with a bundle half handed out keeps no shared memory; pinning opens a bundle into
pinned copies."""

from __future__ import annotations

import gc
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import ShardDataset, WebLoader
from shardkit.errors import ShardkitError
from shardkit.format.manifest.model import Manifest
from shardkit.per_process import PerProcess
from shardkit.streaming.arena import Lanes, WorkerArena
from shardkit.streaming.bundles import (
    BUNDLE_BYTES,
    BUNDLE_GUESSED,
    BUNDLE_MAX,
    Bundle,
    Packed,
    bundle_cap,
    bundles,
)
from shardkit.streaming.transfer import can_pin, deliver
from shardkit.streaming.workers import Packer
from tests.hostile.test_worker_modes import KNOWN, oracle, same

MakeShards = Callable[..., Manifest]
SIZES = [7, 11, 3, 9, 13, 10, 7]  # 60 samples: 30 batches of 2, 15 a worker


def pipeline(m: Manifest | str) -> ShardDataset:
    return ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").batched(2)


def keys(batches: Iterator[Any]) -> list[list[str]]:
    return [list(b[0]) for b in batches]


def processes(m: Manifest | str) -> WebLoader:
    return WebLoader(pipeline(m), num_workers=2, multiprocessing_context="fork", timeout=60)


def test_bundles_grow_to_their_cap_and_an_error_ends_one_after_its_batches() -> None:
    def made(n: int, fail: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        for i in range(n):
            if i == fail:
                raise ValueError(f"batch {i}")
            yield i, {"s": i}

    sizes = [len(b.batches) for b in bundles(made(20), 4, 1)]
    assert sizes == [1, 2, 4, 4, 4, 4, 1]
    got = []
    with pytest.raises(ValueError, match="batch 5"):
        for b in bundles(made(20, fail=5), 4, 1):
            assert b.worker == 1 and b.metas == [{"s": i} for i in b.batches]
            got.append(b.batches)
    assert got == [[0], [1, 2], [3, 4]]  # the bundle under way crossed with what it had
    assert bundle_cap(None, 8) == 2 and bundle_cap(64 << 20, 8) == 1
    assert bundle_cap(100, 8) == BUNDLE_GUESSED and bundle_cap(100, 8, seen=100) == BUNDLE_MAX
    assert bundle_cap(1, 32, seen=BUNDLE_BYTES / 32 / 4) == 4  # a quarter of each of 32 shares


def test_processes_hand_out_the_threads_order_and_resume_mid_bundle(
    make_shards: MakeShards,
) -> None:
    m = make_shards(SIZES)
    want = keys(WebLoader(pipeline(m), num_workers=2, worker_mode="thread"))
    loader = processes(m)
    assert keys(loader) == want
    items = loader._loader._iterator._rcvd_idx  # type: ignore[attr-defined]
    assert items < len(want)  # they came in bundles (one a batch: 30 items and the ends)
    for cut in (3, 7):  # worker 0 half-way through its bundle of 2, then of 4
        it = iter(loader)
        head = keys(next(it) for _ in range(cut))
        state = loader.state_dict()
        assert head + keys(it) == want
        resumed = processes(m)
        resumed.load_state_dict(state)
        assert keys(resumed) == want[cut:]


def _corrupt(m: Manifest, shard: int) -> str:
    """A shard's bytes past its first samples changed: reading it fails there."""
    url = m.shards[shard].url
    path = Path(m.base or "") / url
    data = bytearray(path.read_bytes())
    for i in range(len(data) * 2 // 3, len(data) * 2 // 3 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return url.rsplit("/", 1)[-1]


def _until_error(loader: WebLoader) -> tuple[list[list[str]], BaseException]:
    got: list[list[str]] = []
    with pytest.raises(ShardkitError) as caught:
        for b in loader:
            got.append(list(b[0]))
    return got, caught.value


def test_an_error_mid_bundle_comes_after_every_batch_before_it_naming_the_shard(
    make_shards: MakeShards,
) -> None:
    m = make_shards([6] * 10)
    manifest = str(Path(m.base or "") / "manifest.json")
    last = keys(WebLoader(pipeline(manifest), num_workers=2, worker_mode="thread"))[-1][-1]
    name = _corrupt(m, int(last.rsplit("-", 1)[1]) // 6)  # the shard read last
    want, error = _until_error(WebLoader(pipeline(manifest), num_workers=2, worker_mode="thread"))
    got, raised = _until_error(processes(manifest))
    assert got == want and len(got) >= 8  # bundles of 4 had crossed before it
    assert name in str(error) and name in str(raised)


def _torch_maps() -> int:
    """Shared-memory segments mapped into this process (torch's)."""
    with open("/proc/self/maps") as f:
        return sum("/dev/shm/torch_" in line for line in f)


def test_leaving_an_epoch_with_a_bundle_in_flight_keeps_no_shared_memory(
    make_shards: MakeShards,
) -> None:
    m = make_shards(SIZES)
    gc.collect()
    before = _torch_maps()
    loader = processes(m)
    it = iter(loader)
    whole = keys(next(it) for _ in range(7))  # worker 0's bundle of 4 half handed out
    it.close()
    assert keys(loader) == keys(WebLoader(pipeline(m), num_workers=2, worker_mode="thread"))
    assert whole  # and the next epoch was whole
    held = _torch_maps()
    assert held > before  # the workers' slots, while the loader lives
    del loader, it
    until = time.monotonic() + 10
    while _torch_maps() > before and time.monotonic() < until:
        gc.collect()
        time.sleep(0.05)
    assert _torch_maps() == before


@pytest.mark.parametrize("pin", [False, True])
def test_a_bundle_opens_into_each_batch_as_deliver_gives_it(pin: bool) -> None:
    """In one process, as a worker process packs a bundle and the training process opens it
    (pinned: the pin thread's way, copies pinned where a device is): the first bundle
    crosses its pipe whole, later ones take a slot."""
    packer = Packer(Lanes(1))
    packer._arena = PerProcess(lambda: WorkerArena(packer.lanes, 0))  # as in worker 0
    want = [oracle(t) for t in KNOWN]
    for _ in range(3):
        sent = packer(Bundle(list(KNOWN), [{"w": 0}] * len(KNOWN), 0))
        crossed: Packed = pickle.loads(pickle.dumps(sent)).load()
        batches = crossed.pin_memory().batches if pin else crossed.open()
        assert len(batches) == len(KNOWN)
        for got, tree in zip(batches, want, strict=True):
            same(got, tree)
            if pin and isinstance(got, torch.Tensor):
                assert got.is_pinned() == can_pin()
    for got, tree in zip(KNOWN, want, strict=True):  # threads and 0 workers
        same(deliver(got), tree)
