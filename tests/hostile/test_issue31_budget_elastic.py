"""Hostile review of issue 31: an elastic resume of budget batches leaves nothing out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards


def budget_loader(m: Manifest, workers: int) -> WebLoader:
    ds = ShardDataset(m, seed=3).decode().batched(budget=1500, cost="tokens.npy", buffer=30)
    return WebLoader(ds, num_workers=workers, multiprocessing_context="fork")


def keys(batches: list[Any]) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


@pytest.mark.integration
def test_a_worker_count_change_gives_the_held_groups_rest(tmp_path: Path) -> None:
    """2 worker processes, 5 batches, resumed on 1 worker: each worker's held group's rest
    is given after the resume (it was left out: 39 of 200, then counted as dropped), each
    document once."""
    m = lognormal_shards(tmp_path / "d", n=200, shards=4)
    head = budget_loader(m, 2)
    it = iter(head)
    first = [next(it) for _ in range(5)]
    state = head.state_dict()
    del it
    tail = budget_loader(m, 1)
    tail.load_state_dict(state)
    rest = list(tail)
    seen = keys(first) + keys(rest)
    assert sorted(seen) == [f"doc-{i:06d}" for i in range(200)]  # once each, none left out
    assert tail.stats()["dropped_samples"] == 0
