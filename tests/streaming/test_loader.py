"""WebLoader with real DataLoader worker processes: length, epochs, persistent and spawned
workers, DataLoader-side batching, tensors in shared memory, stats."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, WebLoader
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.streaming import arena
from shardkit.streaming.transfer import PackedBytes
from shardkit.write.writer import ShardWriter
from tests.helpers.resumable import assert_resumable
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]
SIZES = [7, 11, 3, 9, 13, 10, 7]


def pipeline(m: Manifest, seed: int = 1) -> ShardDataset:
    return (
        ShardDataset(m, seed=seed).shuffle(12).decode().to_tuple("__key__", "tokens.npy").batched(4)
    )


def in_a_slot(t: torch.Tensor) -> bool:
    """The tensor views a worker's arena slot (no copy was made on arrival)."""
    return any(
        seg.ctypes.data <= t.data_ptr() < seg.ctypes.data + len(seg)
        for _, seg, _ in list(arena._SEGMENTS.values())
    )


def epoch_keys(loader: WebLoader, epoch: int) -> list[list[str]]:
    loader.set_epoch(epoch)
    return [list(b[0]) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_in_len_batches(make_shards: MakeShards, workers: int) -> None:
    m = make_shards(SIZES)
    loader = WebLoader(
        pipeline(m), num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    batches = epoch_keys(loader, 0)
    assert len(batches) == len(loader)
    flat = [k for b in batches for k in b]
    assert sorted(flat) == [f"sample-{i:08d}" for i in range(60)]
    assert epoch_keys(loader, 0) == batches, "the same epoch gives the same order"
    assert epoch_keys(loader, 1) != batches, "another epoch gives another order"
    tokens = next(iter(loader))[1]
    assert (
        isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32 and tokens.shape == (4, 64)
    )


def test_persistent_and_spawned_workers_follow_epochs_and_state(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    forked = WebLoader(pipeline(m), num_workers=2, multiprocessing_context="fork")
    want = [epoch_keys(forked, e) for e in (0, 1)]
    spawned = WebLoader(
        pipeline(m), num_workers=2, multiprocessing_context="spawn", persistent_workers=True
    )
    assert [epoch_keys(spawned, e) for e in (0, 1)] == want
    # resume epoch 0 after 5 batches in the same (persistent) workers
    spawned.set_epoch(0)
    it = iter(spawned)
    head = [list(next(it)[0]) for _ in range(5)]
    state = spawned.state_dict()
    del it
    spawned.load_state_dict(state)
    assert head + [list(b[0]) for b in spawned] == want[0]


def test_dataloader_side_batching_resumes_and_drops_last(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)

    def make(drop_last: bool) -> WebLoader:
        ds = ShardDataset(m, seed=2).shuffle(6).to_tuple("__key__")
        return WebLoader(
            ds, batch_size=5, num_workers=2, drop_last=drop_last, multiprocessing_context="fork"
        )

    full = [list(b[0]) for b in make(False)]
    assert len(full) == len(make(False)) == 12  # 30 per worker: 6 batches each
    loader = make(False)
    it = iter(loader)
    head = [list(next(it)[0]) for _ in range(7)]
    state = loader.state_dict()
    again = make(False)
    again.load_state_dict(state)
    assert head + [list(b[0]) for b in again] == full
    assert head == full[:7]
    assert len(make(True)) == 12


def test_batches_cross_from_workers_through_the_arena(make_shards: MakeShards) -> None:
    """Arrays of a worker's batch arrive as tensors viewing the worker's reused shared slot
    (small ones pickle with the batch, as does each worker's first batch when it is small);
    the epoch's batches come in a few slots, not a fresh segment each."""
    big = make_shards([40, 40], tokens=20_000)  # 4 x 80 KB a batch
    small = make_shards([8, 8], tokens=32)  # 4 x 128 bytes a batch
    for m, viewed in ((big, True), (small, False)):
        before = arena.SEGMENTS_RECEIVED
        loader = WebLoader(pipeline(m), num_workers=2, multiprocessing_context="fork")
        for i, batch in enumerate(loader):
            assert isinstance(batch[1], torch.Tensor) and batch[1].dtype == torch.int32
            assert in_a_slot(batch[1]) is (viewed and i >= 2)  # 0, 1: the workers' first
        if viewed:  # 20 batches, slots reused: at most prefetch + 2 per worker
            assert 2 <= arena.SEGMENTS_RECEIVED - before <= 2 * 4


def test_stats_report_rates_waits_and_skips(make_shards: MakeShards) -> None:
    m = make_shards([20, 20, 20])
    os.unlink(m.resolve(m.shards[1].url))
    ds = ShardDataset(m, seed=1, handler="warn").to_tuple("__key__").batched(8)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    got = sum(len(b[0]) for b in loader)
    stats: dict[str, Any] = loader.stats()
    assert got == 40 == stats["samples"]
    assert stats["skipped_shards"] == 1 and stats["skipped_samples"] == 20
    assert stats["batches"] == 6 and stats["bytes"] >= 40 * 300
    assert stats["samples_per_s"] > 0 and stats["mb_per_s"] > 0
    assert 0 <= stats["wait_mean_s"] <= stats["wait_p99_s"]
    assert 0 < stats["wait_fraction"] <= 1 and isinstance(stats["io"], dict)


def test_options_that_would_break_the_plan_are_refused(make_shards: MakeShards) -> None:
    m = make_shards([4])
    with pytest.raises(ConfigError, match="shuffle"):
        WebLoader(ShardDataset(m), shuffle=True)
    with pytest.raises(ConfigError, match="ShardDataset"):
        WebLoader([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        len(WebLoader(ShardDataset(m).select(bool)))


def test_remote_shards_stream_through_the_node_cache_and_resume(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    """The same pipeline over a real HTTP Range server, with the node-local cache."""
    m = make_shards([10] * 6, tokens=500, subdir="remote")
    local = WebLoader(pipeline(m), num_workers=2, multiprocessing_context="fork")
    want = epoch_keys(local, 0)
    with RangeServer(str(m.base)) as srv:

        def make() -> WebLoader:
            ds = ShardDataset(srv.url("manifest.json"), seed=1, cache_dir=str(tmp_path / "c"))
            ds = ds.shuffle(12).decode().to_tuple("__key__", "tokens.npy").batched(4)
            return WebLoader(ds, num_workers=2, multiprocessing_context="fork")

        remote = make()
        assert epoch_keys(remote, 0) == want
        io = remote.stats()["io"]  # summed over both workers
        assert io["bytes_fetched"] >= m.total_bytes and io["requests"] >= 6, io
        shard_requests = len(srv.requests("/data-*.tar"))
        assert {r.path for r in srv.requests("/data-*.tar")} == {
            f"/data-{i:06d}.tar" for i in range(6)
        }
        again = make()
        it = iter(again)
        head = [list(next(it)[0]) for _ in range(5)]
        state = again.state_dict()
        del it
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [list(b[0]) for b in resumed] == want
        assert len(srv.requests("/data-*.tar")) == shard_requests, (
            "a cached shard was fetched again"
        )


def test_big_byte_fields_cross_as_one_shared_tensor(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with ShardWriter(tmp_path, maxsize="1MB") as w:
        for i in range(24):
            w.write({"__key__": f"k{i:03d}", "bin": rng.bytes(100_000 + i), "cls": i})
    m = Manifest.load(tmp_path / "manifest.json")

    def batches(workers: int) -> list[Any]:
        ds = ShardDataset(m, seed=3).shuffle(5).to_tuple("bin", "cls").batched(4)
        ctx = "fork" if workers else None
        return list(WebLoader(ds, num_workers=workers, multiprocessing_context=ctx))

    plain, shared = batches(0), batches(2)
    assert len(plain) == len(shared) == 6
    assert all(type(b[0]) is PackedBytes for b in plain)  # the same rule in every mode
    bins = sorted((bytes(x) for b in shared for x in b[0]), key=len)
    assert bins == sorted((x for b in plain for x in b[0]), key=len)
    assert all(type(b[0]) is PackedBytes for b in shared)
    assert not in_a_slot(shared[0][0].tensor)  # a worker's small first batch: the pipe
    packed = shared[2][0]
    assert in_a_slot(packed.tensor)
    assert len(packed) == 4 and packed[-1] == packed[3] and packed[1:3] == [packed[1], packed[2]]
    assert packed.offsets[-1] == sum(len(x) for x in packed) == packed.tensor.numel()
    with pytest.raises(IndexError):
        packed[4]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_meets_the_resume_contract(make_shards: MakeShards, workers: int) -> None:
    m = make_shards(SIZES)
    ctx = "fork" if workers else None
    assert_resumable(
        lambda: WebLoader(pipeline(m, seed=4), num_workers=workers, multiprocessing_context=ctx),
        rounds=2,
        seed=workers,
        prepare=lambda loader: loader.set_epoch(2),
    )


def _noisy(item: tuple[str]) -> tuple[str, float]:
    return item[0], float(np.random.random())  # user code using the global RNG


def test_workers_are_seeded_by_seed_epoch_and_rank_not_the_trainer(
    make_shards: MakeShards,
) -> None:
    m = make_shards([8, 8])

    def run(epoch: int, workers: int = 2) -> list[tuple[str, float]]:
        ds = ShardDataset(m, seed=5).to_tuple("__key__").map(_noisy)
        ctx = "fork" if workers else None
        loader = WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)
        loader.set_epoch(epoch)
        return [tuple(x) for x in loader]  # type: ignore[misc]

    assert run(0) == run(0)
    assert [v for _, v in run(0)] != [v for _, v in run(1)]
    np.random.seed(123)
    drawn = [v for _, v in run(0, workers=0)]
    np.random.seed(123)
    assert drawn == [np.random.random() for _ in range(16)], "the loader reseeded the trainer"


def test_resume_after_a_worker_ran_out_keeps_the_round_robin(make_shards: MakeShards) -> None:
    """Workers of 31 and 30 samples in batches of 2: 16 and 15 batches, the last one
    alone; every stop near the end resumes into the same tail."""
    m = make_shards([31, 30])

    def make() -> WebLoader:
        ds = ShardDataset(m, seed=8).shuffle(7).to_tuple("__key__").batched(2)
        return WebLoader(ds, num_workers=2, multiprocessing_context="fork")

    assert len(make()) == 31
    assert_resumable(make, stops=[0, 1, 2, 15, 28, 29, 30, 31])


def test_workers_release_their_prefetch_leases_at_the_end_of_an_epoch(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    """A loader's workers read through the data set's one iteration path: at the end of an
    epoch they let go of the shards they prefetched and did not read (a shortest mix stops
    reading one source mid-way), so eviction is free to take those shards."""
    from shardkit import mix
    from shardkit.cache import CacheStore
    from shardkit.cache.locks import try_lock_existing

    small = make_shards([10, 10], subdir="a", seed=7)
    large = make_shards([10] * 8, subdir="b")
    cache = tmp_path / "cache"
    with RangeServer(str(tmp_path)) as srv:

        def remote(name: str) -> ShardDataset:
            url = srv.url(f"{name}/manifest.json")
            return ShardDataset(url, shardshuffle=False, cache_dir=str(cache))

        assert len(list(remote("b"))) == large.total_samples  # every shard of b is cached
        mixed = mix([remote("a"), remote("b")], [0.5, 0.5], seed=2)
        loader = WebLoader(mixed, num_workers=0)
        got, waited = [], False
        for sample in loader:
            got.append(sample["__url__"])
            if not waited and "/b/" in got[-1]:
                # b hinted its next shards on its first read; let those prefetches lease
                # them (a prefetch still running at the epoch's end is not waited for)
                opener: Any = mixed.sources[1].opener()
                assert opener._local.wait_idle(60)
                waited = True
    from_b = sum("/b/" in u for u in got)
    assert waited and from_b < large.total_samples and len(got) - from_b == small.total_samples
    store = CacheStore(str(cache))
    held = []
    for shard in store.shards():
        fd = try_lock_existing(shard.path)  # None while a reader or a prefetch leases it
        if fd is None:
            held.append(shard.path)
        else:
            os.close(fd)
    assert len(list(store.shards())) == 10 and held == []


def test_an_error_stops_the_worker_processes_at_once(make_shards: MakeShards) -> None:
    """A loader that fails on bad data stops its workers when the error leaves it: the
    traceback keeps torch's iterator alive, and its own shutdown at collection waited 5 s
    per worker (a training job that failed on a corrupt shard hung on its way out). The
    collection that frees the iterator is timed over the loader's objects alone: the
    objects made before it are frozen (a full collection of the suite's heap took 2.4 s
    under load on CI, none of it the loader's)."""
    import gc
    import multiprocessing
    import time

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    from shardkit.errors import ChecksumError

    m = make_shards([6, 6, 6])
    bad = Path(m.base or "") / m.shards[1].url
    data = bytearray(bad.read_bytes())
    data[700] ^= 0xFF
    bad.write_bytes(bytes(data))
    ds = ShardDataset(str(Path(m.base or "") / "manifest.json")).batched(2)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    gc.disable()  # what is measured is the loader's own shutdown, not a collection
    gc.freeze()  # and not the traversal of what earlier tests left
    others = set(multiprocessing.active_children())  # left by earlier tests: not this loader's

    def workers() -> set[object]:
        return set(multiprocessing.active_children()) - others

    try:
        with pytest.raises(ChecksumError):
            list(loader)
        began = time.monotonic()
        while workers() and time.monotonic() - began < 3:
            time.sleep(0.05)
        assert not workers()
        start = time.monotonic()
        gc.collect()
        assert time.monotonic() - start < 2
        # the timed collection is the one that ran the iterator's finalizer
        assert not [o for o in gc.get_objects() if isinstance(o, _MultiProcessingDataLoaderIter)]
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_script_that_leaves_an_epoch_early_exits_cleanly(
    make_shards: MakeShards, mode: str
) -> None:
    """One batch taken, then the interpreter exits with the epoch under way: the workers
    stop, nothing is printed (the clean-up used to run with modules half torn down and
    print "Exception ignored" tracebacks)."""
    m = make_shards(SIZES)
    manifest = os.path.join(str(m.base), "manifest.json")
    script = (
        "import sys, shardkit\n"
        f"ds = shardkit.ShardDataset({manifest!r}).decode().batched(4)\n"
        f"loader = shardkit.WebLoader(ds, num_workers=2, worker_mode={mode!r})\n"
        "it = iter(loader)\n"
        "print(len(next(it)['__key__']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "4" and proc.stderr == "", proc.stderr


def _with_pid(sample: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*sample, os.getpid())


@pytest.mark.parametrize("persistent", [None, False])
def test_worker_processes_persist_across_epochs_by_default(
    make_shards: MakeShards, persistent: bool | None
) -> None:
    """The same worker processes serve every epoch (a fresh one re-faults every page it
    touches), unless persistent_workers=False; the batches are the same either way."""
    m = make_shards(SIZES)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    ds = ShardDataset(m, seed=1).decode().to_tuple("__key__", "tokens.npy").map(_with_pid)
    loader = WebLoader(ds.batched(4), num_workers=2, multiprocessing_context="fork", **extra)
    epochs = []
    for epoch in (0, 1, 0):
        loader.set_epoch(epoch)
        epochs.append([(list(b[0]), set(b[2].tolist())) for b in loader])
    pids = [set().union(*(p for _, p in e)) for e in epochs]
    assert len(pids[0]) == 2 and os.getpid() not in pids[0]
    assert (pids[0] == pids[1] == pids[2]) is (persistent is None)
    assert [k for k, _ in epochs[0]] == [k for k, _ in epochs[2]] != [k for k, _ in epochs[1]]
