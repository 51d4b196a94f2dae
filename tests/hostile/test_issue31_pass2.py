"""Hostile review of issue 31, second pass: chains of loads (a state saved after an elastic
or batching-change load, loaded again) give each document once."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """120 documents of log-normal length (median 300 tokens) in 4 shards."""
    return lognormal_shards(tmp_path_factory.mktemp("docs"), n=120, shards=4)


def pipeline(m: Manifest, batching: str) -> ShardDataset:
    ds = ShardDataset(m, seed=3).shuffle(16).decode()
    if batching == "budget":
        return ds.batched(budget=3000, cost="tokens.npy", buffer=20)
    return ds.batched(int(batching))


def run(m: Manifest, legs: list[tuple[str, int, int | None]]) -> tuple[list[str], WebLoader]:
    """Each leg: a loader of ``batching`` on ``workers`` thread workers, loading the state
    the leg before saved (a batching change allowed), giving ``steps`` batches (None: to
    the epoch's end)."""
    state: dict[str, Any] | None = None
    got: list[str] = []
    for batching, workers, steps in legs:
        ld = WebLoader(pipeline(m, batching), num_workers=workers, worker_mode="thread")
        if state is not None:
            ld.load_state_dict(state, allow={"batch_size"})
        for n, batch in enumerate(ld, 1):
            got += list(batch["__key__"])
            if n == steps:
                break
        state = json.loads(json.dumps(ld.state_dict()))
    return got, ld


def twice(keys: list[str]) -> list[str]:
    return sorted(k for k, v in collections.Counter(keys).items() if v > 1)


@pytest.mark.integration
@pytest.mark.parametrize("batching", ["budget", "5"])
def test_a_load_saved_before_every_worker_gave_a_batch_gives_each_document_once(
    docs: Manifest, batching: str
) -> None:
    """2 workers holding budget groups -> 3 workers, one batch (workers 1 and 2 have given
    none: their state is the load's, every held group) -> 1 worker: the held groups were
    given again by the merge of the workers that had not started (23 documents twice, 143
    for 120, no error)."""
    got, ld = run(docs, [("budget", 2, 5), (batching, 3, 1), (batching, 1, None)])
    assert twice(got) == []
    assert len(got) + ld.stats()["dropped_samples"] == 120
