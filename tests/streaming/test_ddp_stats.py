"""The job-wide loader stats: 2 spawned ranks, a gloo group on 127.0.0.1, each rank's
``loader.stats()`` summed, min'd and max'd by :func:`shardkit.metrics.job_summary`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.metrics import job_summary
from tests.helpers.ranks import run_ranks

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]
WORLD = 2


def _rank(manifest: str, rank: int) -> dict[str, Any]:
    ds = ShardDataset(manifest, seed=3).split_by_node().to_tuple("__key__").batched(5)
    loader = WebLoader(ds, num_workers=0)
    batches = sum(1 for _ in loader)
    local = loader.stats()
    job = job_summary(local)
    mismatch = ""
    try:  # a rank whose stats have other keys: every rank is told, none hangs
        job_summary({**local, "extra": 1} if rank == 1 else local)
    except ConfigError as exc:
        mismatch = str(exc)
    return {"batches": batches, "local": local, "job": job, "mismatch": mismatch}


def test_job_summary_sums_and_bounds_every_ranks_stats(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    m = make_shards([10, 20, 15, 5])
    manifest = str(Path(m.base or "") / "manifest.json")
    ranks = run_ranks(functools.partial(_rank, manifest), WORLD, tmp_path)
    job = ranks[0]["job"]
    assert all(r["job"] == job for r in ranks), "every rank gets the same view"
    assert job["world_size"] == WORLD
    assert job["sum"]["samples"] == m.total_samples == sum(r["local"]["samples"] for r in ranks)
    assert job["sum"]["batches"] == sum(r["batches"] for r in ranks)
    assert type(job["sum"]["samples"]) is int and type(job["sum"]["bytes"]) is int
    for key in ("samples_per_s", "wait_fraction", "wait_p99_s", "first_batch_s"):
        values = [r["local"][key] for r in ranks]
        assert job["min"][key] == min(values) and job["max"][key] == max(values), key
        assert abs(job["mean"][key] - sum(values) / WORLD) < 1e-9 * max(1.0, max(values))
    assert all("different keys" in r["mismatch"] for r in ranks)
