"""allow={"seq_len"} under batched(budget=) over packed sequences (issue 31): the group of
sequences a budget batching held was cut at the old length, so the load goes on after it
(as best-fit packing goes on at its next group): never a token twice. Before: with a
batch-size change too the group was replayed from the new packer's sequences (2560 tokens
twice, 1508 never, no error); alone it was refused as a changed cost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.stages.costs import attention_cost
from tests.streaming.test_budget import lognormal_shards


def packed(m: object, seq_len: int, budget: int) -> WebLoader:
    ds = ShardDataset(m, seed=3).decode()  # type: ignore[arg-type]
    ds = ds.pack_tokens("tokens.npy", seq_len, boundaries=True, pad=-1)
    return WebLoader(ds.batched(budget=budget, cost=attention_cost, buffer=32))


def tokens(batches: list[dict[str, object]]) -> np.ndarray:
    parts = [np.asarray(t).ravel() for b in batches for t in b["tokens"]]  # type: ignore[attr-defined]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@pytest.mark.parametrize("budget", [2_000_000, 500_000])
def test_a_new_seq_len_under_a_budget_goes_on_after_the_group(tmp_path: Path, budget: int) -> None:
    m = lognormal_shards(tmp_path / "d", n=150, shards=2)  # document i's tokens are all i
    lengths = np.zeros(150, np.int64)
    for s in ShardDataset(m, seed=3).decode():
        lengths[int(s["__key__"].split("-")[1])] = s["tokens.npy"].size
    ld = packed(m, 1024, 2_000_000)
    it = iter(ld)
    head = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(ld.state_dict()))
    assert json.loads(state["ranks"])[0]["workers"][0]["held"]
    later = packed(m, 512, budget)
    later.load_state_dict(state, allow={"seq_len", "batch_size"})
    tail = list(later)
    got = tokens(head + tail)
    counts = np.bincount(got[got >= 0], minlength=150)
    assert (counts <= lengths).all(), f"{int((counts - lengths).clip(0).sum())} tokens twice"
    assert counts.sum() > 0.6 * lengths.sum()
