"""Budget batches and batch-size changes with real ranks: 2 spawned gloo ranks, 2 DataLoader
worker processes each, one collective per step (a rank with more batches would hang it:
the short timeout fails the test instead).

One job: a budget epoch (equal batch counts, no document twice, per-step token counts of
the ranks within 10% on >= 90% of steps), its exact resume (head + tail == the epoch on
every rank), then a batch-size change mid-epoch (budget ->
batched(8), loaded on every rank with allow={"batch_size"}: equal counts, nothing twice),
and a plain batched(4) state saved by the 2 ranks, loaded on 1 process with batched(8) (a
batch-size ramp on a new world size): head + tail is every document once.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shardkit import ShardDataset, WebLoader
from tests.helpers.ranks import run_ranks
from tests.streaming.test_budget import BUDGET, lognormal_shards

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 1200


def ds(root: str, rank: int, world: int) -> ShardDataset:
    return ShardDataset(Path(root, "manifest.json"), seed=5).split_by_node(rank, world).decode()


def loader(d: ShardDataset) -> WebLoader:
    return WebLoader(d, num_workers=2, multiprocessing_context="fork")


def steps(it: Any, n: int | None = None) -> list[dict[str, Any]]:
    out = []
    for batch in it:
        dist.all_reduce(torch.ones(1))  # the gradient all-reduce stand-in
        out.append(
            {"keys": list(batch["__key__"]), "cost": sum(t.numel() for t in batch["tokens.npy"])}
        )
        if n is not None and len(out) == n:
            break
    return out


def _rank(rank: int, root: str) -> dict[str, Any]:
    budget = ds(root, rank, 2).batched(budget=BUDGET * 2 // 3, cost="tokens.npy", buffer=200)
    head_ld = loader(budget)
    epoch = steps(head_ld)
    head = steps(iter(head_ld), 3)
    state = head_ld.state_dict()  # every rank, the same step
    exact = loader(budget)
    exact.load_state_dict(json.loads(json.dumps(state)))
    exact_tail = steps(exact)
    ramp = loader(ds(root, rank, 2).batched(8))
    ramp.load_state_dict(json.loads(json.dumps(state)), allow={"batch_size"})
    tail = steps(ramp)
    plain = loader(ds(root, rank, 2).batched(4))
    plain_head = steps(iter(plain), 5)
    plain_state = plain.state_dict()
    if rank == 0:
        Path(root, "plain_state.json").write_text(json.dumps(plain_state), encoding="utf-8")
    out = {"epoch": epoch, "head": head, "tail": tail, "plain_head": plain_head}
    return {**out, "exact_tail": exact_tail}


def test_budget_batches_and_batch_size_changes_on_two_ranks(tmp_path: Path) -> None:
    root = tmp_path / "d"
    lognormal_shards(root, n=N, shards=8)
    got = run_ranks(functools.partial(_rank, root=str(root)), 2, tmp_path)
    everything = {f"doc-{i:06d}" for i in range(N)}

    epochs = [r["epoch"] for r in got]
    assert len(epochs[0]) == len(epochs[1]) > 10
    seen = [k for e in epochs for s in e for k in s["keys"]]
    assert len(seen) == len(set(seen)) and set(seen) <= everything
    pairs = list(zip(*([s["cost"] for s in e] for e in epochs), strict=True))
    assert sum(max(p) <= 1.1 * min(p) for p in pairs) / len(pairs) >= 0.9

    for r in got:  # exact: head + tail is the uninterrupted epoch, batch for batch
        assert r["head"] + r["exact_tail"] == r["epoch"]
    assert len(got[0]["tail"]) == len(got[1]["tail"])
    changed = [k for r in got for s in r["head"] + r["tail"] for k in s["keys"]]
    assert len(changed) == len(set(changed)) and len(changed) > N * 0.9

    one = loader(
        ShardDataset(root / "manifest.json", seed=5).split_by_node(0, 1).decode().batched(8)
    )
    one.load_state_dict(json.loads((root / "plain_state.json").read_text()), allow={"batch_size"})
    tail = [k for b in one for k in b["__key__"]]
    head = [k for r in got for s in r["plain_head"] for k in s["keys"]]
    assert sorted(head + tail) == sorted(everything)
