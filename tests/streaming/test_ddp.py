"""A real DDP job: 3 spawned ranks with a gloo process group on 127.0.0.1, 2 DataLoader
workers each, 7 uneven shards. A collective every step and after the loop proves every
rank yields the same number of batches; every sample is read once per epoch; epochs
differ; a rerun with the same seed matches."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest
from tests.helpers.servers import free_port

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]
SIZES = [5, 17, 9, 23, 2, 11, 14]  # 81 samples: 27 per rank, 14 + 13 per worker
WORLD = 3


def _epoch(loader: WebLoader, epoch: int) -> dict[str, Any]:
    loader.set_epoch(epoch)
    keys: list[str] = []
    steps = 0
    for batch in loader:
        keys += list(batch[0])
        steps += 1
        dist.all_reduce(torch.ones(1))  # a gradient sync: hangs if a rank has fewer batches
    count = torch.tensor([steps])
    low, high = count.clone(), count.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, keys)
    return {"steps": steps, "len": len(loader), "min": int(low), "max": int(high), "all": everyone}


def _rank_main(rank: int, port: int, manifest: str, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        results = {}
        for run, epochs in (("first", (0, 1)), ("rerun", (0,))):
            ds = ShardDataset(manifest, seed=7).split_by_node().shuffle(8).to_tuple("__key__")
            loader = WebLoader(
                ds.batched(4),
                num_workers=2,
                persistent_workers=True,
                multiprocessing_context="fork",
            )
            for epoch in epochs:
                results[f"{run}-{epoch}"] = _epoch(loader, epoch)
        with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def test_three_ranks_two_workers_equal_batches_every_sample_once(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    m = make_shards(SIZES)
    manifest = str(Path(m.base or "") / "manifest.json")
    mp.spawn(_rank_main, args=(free_port(), manifest, str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    everything = [f"sample-{i:08d}" for i in range(81)]
    for name in ("first-0", "first-1", "rerun-0"):
        steps = {r[name]["steps"] for r in ranks}
        assert steps == {8}, f"{name}: ranks yielded {steps} batches"
        assert all(r[name]["len"] == 8 and r[name]["min"] == r[name]["max"] == 8 for r in ranks)
        gathered = ranks[0][name]["all"]
        assert sorted(k for keys in gathered for k in keys) == everything, name
    for r in ranks:
        assert r["first-0"]["all"] == r["rerun-0"]["all"], "a rerun with the same seed differs"
        assert r["first-0"]["all"] != r["first-1"]["all"], "epochs 0 and 1 have the same order"
    shares = [set(keys) for keys in ranks[0]["first-0"]["all"]]
    assert shares != [set(keys) for keys in ranks[0]["first-1"]["all"]]


ROOT = Path(__file__).resolve().parents[2]


def _torchrun(tmp: Path, log: str, ckpt: str, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(ROOT / "examples" / "train_ddp.py"), "--data", str(tmp / "data"), "--docs", "150"]
    cmd += ["--ckpt", str(tmp / ckpt), "--step-log", str(tmp / log), "--save-every", "3", *extra]
    subprocess.run(cmd, cwd=tmp, check=True, timeout=240, capture_output=True)


def _steps(path: Path) -> list[tuple[int, int, int, str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted((r["rank"], r["epoch"], r["step"], r["batch"], r["loss"]) for r in rows)


def test_the_example_resumes_training_exactly(tmp_path: Path) -> None:
    """examples/train_ddp.py under torchrun: stopped mid-epoch and rerun, it trains on the
    same batches with the same losses as an uninterrupted run."""
    _torchrun(tmp_path, "full.jsonl", "full.pt")
    _torchrun(tmp_path, "parts.jsonl", "parts.pt", "--stop-after", "29")
    assert max(s[2] for s in _steps(tmp_path / "parts.jsonl")) == 29
    _torchrun(tmp_path, "parts.jsonl", "parts.pt")
    full = _steps(tmp_path / "full.jsonl")
    assert len(full) == 2 * max(s[2] for s in full) and {s[1] for s in full} == {0, 1}
    end_of_epoch_0 = max(s[2] for s in full if s[1] == 0)
    assert end_of_epoch_0 < 29 < max(s[2] for s in full), "the stop should fall in epoch 1"
    assert _steps(tmp_path / "parts.jsonl") == full
