"""``WebLoader(worker_mode="thread")``: threads play the worker processes, in their order, with
the same state (exact resume, across modes too), errors, stats and the DDP contract."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import shardkit as sk
from shardkit.errors import ChecksumError, ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.stages.collate import collate_numpy as sk_collate
from tests.helpers.ranks import run_ranks
from tests.helpers.servers import RangeServer

SIZES = [5, 17, 9, 23, 2, 11, 14]  # 81 samples
# three worker processes on this 2-core machine: torch's advice, not an error here
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture
def manifest(make_shards: Callable[..., Manifest]) -> str:
    m = make_shards(SIZES, subdir="ds")
    return str(Path(str(m.base)) / "manifest.json")


def _loader(source: str | Manifest, mode: str, workers: int = 3, **kw: Any) -> sk.WebLoader:
    ds = sk.ShardDataset(source, seed=5).shuffle(8).decode().to_tuple("__key__", "tokens.npy")
    kwargs: dict[str, Any] = {"multiprocessing_context": "fork"} if mode == "process" else {}
    return sk.WebLoader(ds.batched(4), num_workers=workers, worker_mode=mode, **kwargs, **kw)


def _keys(batches: Any) -> list[list[str]]:
    return [list(b[0]) for b in batches]


def _workers_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shardkit-worker-")]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_threads_hand_out_the_batches_of_processes_in_their_order(
    manifest: str, workers: int
) -> None:
    batches = list(_loader(manifest, "process", workers))
    want = _keys(batches)
    loader = _loader(manifest, "thread", workers)
    got = list(loader)
    assert _keys(got) == want
    assert all(torch.equal(a[1], b[1]) for a, b in zip(got, batches, strict=True))
    assert sorted(k for b in want for k in b) == [f"sample-{i:08d}" for i in range(81)]
    assert isinstance(got[0][1], torch.Tensor)  # arrays arrive as tensors, as from processes
    assert len(loader) == len(want)
    assert not _workers_alive()


def test_a_thread_state_resumes_exactly_in_threads_and_in_processes(manifest: str) -> None:
    whole = _keys(_loader(manifest, "thread"))
    first = _loader(manifest, "thread")
    it = iter(first)
    head = [list(next(it)[0]) for _ in range(7)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    assert head == whole[:7]
    for mode in ("thread", "process"):
        again = _loader(manifest, mode)
        again.load_state_dict(state)
        assert again.remaining() == len(whole) - 7
        assert _keys(again) == whole[7:], mode


def test_an_error_in_a_thread_worker_reaches_the_loop_naming_the_shard(
    make_shards: Callable[..., Manifest],
) -> None:
    m = make_shards([6, 6, 6], subdir="bad")
    bad = Path(str(m.base)) / m.shards[1].url
    data = bytearray(bad.read_bytes())
    data[700] ^= 0xFF
    bad.write_bytes(bytes(data))
    loader = _loader(str(Path(str(m.base)) / "manifest.json"), "thread", workers=2)
    with pytest.raises(ChecksumError) as info:
        list(loader)
    assert m.shards[1].url in str(info.value)
    assert not _workers_alive()


def test_leaving_an_epoch_early_stops_the_threads(manifest: str) -> None:
    loader = _loader(manifest, "thread", workers=2, prefetch_factor=1)
    it = iter(loader)
    next(it)
    assert len(_workers_alive()) == 2
    it.close()  # type: ignore[attr-defined]
    assert not _workers_alive()
    assert len(list(loader)) == len(loader)  # the next epoch starts afresh


def test_io_is_counted_once_for_the_threads(manifest: str) -> None:
    """The threads share the process's io counters: the loader counts them once, so its
    stats say what the server saw (worker processes each count their own)."""
    root = Path(manifest).parent
    with RangeServer(root) as server:
        for mode in ("process", "thread"):
            remote = sk.io.load_manifest(server.url("manifest.json"))
            loader = _loader(remote, mode, workers=2)
            before = len(server.log)
            assert len(list(loader)) == len(loader)
            seen = server.log[before:]
            stats = loader.stats()
            assert stats["requests"] == len(seen), mode
            assert stats["bytes_fetched"] == sum(r.sent for r in seen), mode
            assert {r.path for r in seen} >= {f"/{p.name}" for p in root.glob("*.tar")}


def test_thread_mode_refuses_what_it_cannot_do(manifest: str) -> None:
    ds = sk.ShardDataset(manifest).batched(4)
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        sk.WebLoader(ds, worker_mode="thread")
    with pytest.raises(ConfigError, match="worker_mode='fiber'"):
        sk.WebLoader(ds, num_workers=2, worker_mode="fiber")
    with pytest.raises(ConfigError, match="generator not supported"):
        sk.WebLoader(ds, num_workers=2, worker_mode="thread", generator=torch.Generator())


WORLD = 2


def _rank(manifest: str, rank: int) -> dict[str, Any]:
    ds = sk.ShardDataset(manifest, seed=7).split_by_node().to_tuple("__key__")
    loader = sk.WebLoader(ds.batched(4), num_workers=2, worker_mode="thread")
    steps = 0
    keys: list[str] = []
    for batch in loader:
        keys += list(batch[0])
        steps += 1
        dist.all_reduce(torch.ones(1))  # hangs if a rank has fewer batches
    return {"steps": steps, "len": len(loader), "keys": keys}


@pytest.mark.integration
def test_thread_workers_keep_the_ddp_contract(manifest: str, tmp_path: Path) -> None:
    ranks = run_ranks(functools.partial(_rank, manifest), WORLD, tmp_path)
    assert len({r["steps"] for r in ranks} | {r["len"] for r in ranks}) == 1
    keys = [k for r in ranks for k in r["keys"]]
    assert len(keys) == len(set(keys)) and len(keys) > 81 - 4 * 2 * 2 * WORLD


def _slow(sample: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.004)
    return sample


def _slow_collate(items: list[Any]) -> Any:
    time.sleep(0.01)
    return sk_collate(items)


@pytest.mark.parametrize("mode", ["process", "thread"])
@pytest.mark.parametrize("where", ["pipeline", "dataloader"])
def test_stats_say_where_the_time_goes(manifest: str, mode: str, where: str) -> None:
    """Per-stage time in the stats: a map that sleeps 4 ms a sample shows up as the
    workers' "other" time and a collate that sleeps 10 ms a batch (in the pipeline or the
    DataLoader's) as collation, not as reading or decoding; reading, verifying, decoding
    and (from processes) the transfer are counted."""
    ds = sk.ShardDataset(manifest, seed=5).map(_slow).decode().to_tuple("__key__", "tokens.npy")
    kwargs: dict[str, Any] = {"multiprocessing_context": "fork"} if mode == "process" else {}
    if where == "pipeline":
        ds, kwargs["batch_size"] = ds.batched(4, collate=_slow_collate), None
    else:
        kwargs.update(batch_size=4, collate_fn=_slow_collate)
    loader = sk.WebLoader(ds, num_workers=2, worker_mode=mode, **kwargs)
    batches = list(loader)
    assert len(batches) == len(loader)
    st = loader.stats()
    assert st["time_other_s"] >= 81 * 0.004
    # the collate time of each worker's last batch comes with no later batch
    assert st["time_collate_s"] >= (len(batches) - 2) * 0.01
    assert 0 < st["time_read_s"] < st["time_other_s"] and st["time_decode_s"] > 0
    assert 0 < st["time_verify_s"] <= st["time_read_s"]
    parts = st["time_read_s"] + st["time_decode_s"] + st["time_collate_s"]
    assert parts + st["time_other_s"] == pytest.approx(st["time_worker_s"])
    assert (st["time_transfer_s"] > 0) is (mode == "process")
    assert st["time_wait_s"] == st["wait_total_s"]
