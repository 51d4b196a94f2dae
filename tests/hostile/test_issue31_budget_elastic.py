"""Hostile review of issue 31: what an elastic resume of budget batches leaves out is counted."""

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
def test_a_worker_count_change_counts_the_held_groups_rest_as_dropped(tmp_path: Path) -> None:
    """2 workers, 5 batches, resumed on 1 worker: each worker's held group's rest is left
    out (as pack_tokens does), and stats()["dropped_samples"] says how many (0 before)."""
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
    assert len(seen) == len(set(seen))  # never twice
    missing = 200 - len(seen)
    assert missing > 0  # the held groups' rest (this data and seed: 2 groups held)
    assert tail.stats()["dropped_samples"] == missing
