"""Mid-run changes on 3 real ranks: one spawned gloo job of 3 ranks, DataLoader worker
processes, one collective per step (a rank with more batches would hang it: the short
timeout fails the test instead). One launch runs every scenario in turn:

- each change alone: the world size (a 2-rank state of budget batches holding groups ->
  3 ranks), the worker count (3 x 2 -> 3 x 1), the batch size (budget -> batched(6)), the
  sources (a mixture's b removed, c added), the weights, the packing length;
- combined: a batch-size ramp on a new world size and worker count (2 x 2 budget ->
  3 x 1 batched(8)), and sources with weights on a new world size (2 x 2 -> 3 x 2).

Each: every rank yields the same number of batches, no document is given twice, and where
the data is finite what was given plus what the shared epoch end dropped is the epoch.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from shardkit import ShardDataset, WebLoader, mix
from shardkit.stages.regroup import held_rest
from tests.helpers.ranks import run_ranks
from tests.streaming.test_budget import lognormal_shards

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 150  # budget documents
SIZES = {"a": 45, "b": 30, "c": 24}  # mixture sources
BUDGET = 3000


def docs(root: str, rank: int | None = None, world: int | None = None) -> ShardDataset:
    ds = ShardDataset(Path(root, "docs", "manifest.json"), seed=5)
    return (ds.split_by_node() if rank is None else ds.split_by_node(rank, world)).decode()


def budget(ds: ShardDataset) -> ShardDataset:
    return ds.batched(budget=BUDGET, cost="tokens.npy", buffer=24)


def mixed(root: str, weights: dict[str, float], rank: int | None = None) -> ShardDataset:
    sets = []
    for name in weights:
        ds = ShardDataset(Path(root, name, "manifest.json"), seed=2)
        sets.append((ds.split_by_node() if rank is None else ds.split_by_node(rank, 2)).decode())
    out = mix(sets, weights=list(weights.values()), names=list(weights), stop="longest")
    return out.batched(4)


def loader(ds: ShardDataset, workers: int, mode: str = "process") -> WebLoader:
    if mode == "thread":
        return WebLoader(ds, num_workers=workers, worker_mode="thread")
    return WebLoader(ds, num_workers=workers, multiprocessing_context="fork")


def ids(batch: Any) -> list[str]:
    """A batch's samples as source/key (a mixture's sources share keys)."""
    if isinstance(batch, dict):
        return [
            f"{Path(u).parent.name}/{k}"
            for u, k in zip(batch["__url__"], batch["__key__"], strict=True)
        ]
    tokens = np.asarray(batch).ravel()  # packed sequences: every token is its document's id
    return [str(t) for t in tokens]


def steps(ld: WebLoader, n: int | None = None) -> list[list[str]]:
    out = []
    for batch in ld:
        dist.all_reduce(torch.ones(1))  # the gradient all-reduce stand-in
        out.append(ids(batch))
        if n is not None and len(out) == n:
            break
    return out


def head(ld: WebLoader, n: int) -> tuple[list[list[str]], dict[str, Any]]:
    it = iter(ld)
    got = []
    for _ in range(n):
        got.append(ids(next(it)))
        dist.all_reduce(torch.ones(1))
    return got, json.loads(json.dumps(ld.state_dict()))  # every rank, the same step


def tail(ld: WebLoader, state: dict[str, Any], **allow: Any) -> dict[str, Any]:
    ld.load_state_dict(state, **allow)
    got = steps(ld)
    return {"tail": got, "dropped": ld.stats()["dropped_samples"]}


def packed(root: str, seq_len: int) -> ShardDataset:
    ds = ShardDataset(Path(root, "a", "manifest.json"), seed=5).split_by_node().decode()
    return ds.pack_tokens("tokens.npy", seq_len).batched(4)


def _rank(rank: int, root: str) -> dict[str, Any]:
    saved = json.loads(Path(root, "saved.json").read_text(encoding="utf-8"))
    out: dict[str, Any] = {}
    out["world"] = tail(loader(budget(docs(root)), 2), saved["budget"])
    h, state = head(loader(budget(docs(root)), 2), 2)
    out["workers"] = {"head": h, **tail(loader(budget(docs(root)), 1), state)}
    six = loader(docs(root).batched(6), 2)
    out["batch_size"] = {"head": h, **tail(six, state, allow={"batch_size"})}
    both = {"a": 1.0, "b": 1.0}
    h, state = head(loader(mixed(root, both), 2), 3)
    ac = mixed(root, {"a": 1.0, "c": 1.0})
    out["sources"] = {"head": h, **tail(loader(ac, 2), state, allow={"sources"})}
    weights = mixed(root, {"a": 3.0, "b": 1.0})
    out["weights"] = {"head": h, **tail(loader(weights, 2), state, allow={"weights"})}
    h, state = head(loader(packed(root, 128), 2), 2)
    out["seq_len"] = {"head": h, **tail(loader(packed(root, 192), 2), state, allow={"seq_len"})}
    ramp = loader(docs(root).batched(8), 1)
    out["ramp"] = tail(ramp, saved["budget"], allow={"batch_size"})
    ac3 = mixed(root, {"a": 1.0, "c": 3.0})
    out["mix"] = tail(loader(ac3, 2), saved["mix"], allow={"sources", "weights"})
    return out


def _two_rank_state(make: Any, n: int) -> tuple[list[list[str]], dict[str, Any]]:
    """A state saved by 2 ranks x 2 workers after ``n`` batches each (no process group:
    each rank's own, then joined)."""
    states, got = [], []
    for r in (0, 1):
        ld = loader(make(r), 2, "thread")
        it = iter(ld)
        got += [ids(next(it)) for _ in range(n)]
        states.append(ld.state_dict())
    return got, json.loads(json.dumps(WebLoader.merge_states(states)))


def test_every_change_alone_and_combined_on_three_ranks(tmp_path: Path) -> None:
    root = tmp_path / "d"
    lognormal_shards(root / "docs", n=N, shards=6)
    for k, (name, n) in enumerate(SIZES.items()):
        lognormal_shards(root / name, n=n, shards=3, seed=k + 1)
    head2, budget2 = _two_rank_state(lambda r: budget(docs(str(root), r, 2)), 3)
    workers = [w for r in json.loads(budget2["ranks"]) for w in r["workers"]]
    assert sum(held_rest(w, "test") for w in workers) > 0  # groups held, their rest to give
    mix_head2, mix2 = _two_rank_state(lambda r: mixed(str(root), {"a": 1, "b": 1}, r), 2)
    saved = {"budget": budget2, "mix": mix2}
    (root / "saved.json").write_text(json.dumps(saved), encoding="utf-8")
    got = run_ranks(functools.partial(_rank, root=str(root)), 3, tmp_path)

    def given(case: str, before: list[list[str]] | None = None) -> list[str]:
        if before is None:
            before = [k for r in got for k in r[case].get("head", [])]
        for r in got[1:]:  # the DDP contract: as many batches on every rank
            assert len(r[case]["tail"]) == len(got[0][case]["tail"]), case
        out = [k for b in before for k in b] + [k for r in got for b in r[case]["tail"] for k in b]
        assert len(out) == len(set(out)), f"{case}: a sample given twice"
        return out

    def dropped(case: str) -> int:
        return sum(int(r[case]["dropped"]) for r in got)

    def whole(case: str, n: int, total: int, slack: int = 0) -> None:
        """``n`` given and what the shared epoch end dropped make the epoch's ``total``
        (less what a re-plan on 3 ranks leaves as remainder: at most 2 per source)."""
        assert total - slack <= n + dropped(case) <= total, (case, n, dropped(case), total)

    everything = {f"docs/doc-{i:06d}" for i in range(N)}
    for case, before in (("workers", None), ("batch_size", None), ("world", head2)):
        seen = given(case, before)
        assert set(seen) <= everything
        whole(case, len(seen), N, 0 if before is None else 2)
    whole("ramp", len(given("ramp", head2)), N, 2)

    def of(seen: list[str], source: str) -> int:
        return sum(k.startswith(f"{source}/") for k in seen)

    for case, sources in (("sources", "ac"), ("weights", "ab"), ("mix", "ac")):
        seen = given(case, mix_head2 if case == "mix" else None)
        total = sum(SIZES[x] for x in sources)  # "longest": every sample of the epoch
        whole(case, sum(of(seen, x) for x in sources), total, 2 * len(sources))
    assert not any(k.startswith("b/") for r in got for b in r["sources"]["tail"] for k in b)

    # seq_len: every token is its document's id; none is given more often than its
    # document holds it (the ranks' heads and tails together)
    for r in got[1:]:
        assert len(r["seq_len"]["tail"]) == len(got[0]["seq_len"]["tail"])
    counts: dict[int, int] = {}
    for r in got:
        for b in r["seq_len"]["head"] + r["seq_len"]["tail"]:
            for t in b:
                counts[int(t)] = counts.get(int(t), 0) + 1
    a = ShardDataset(root / "a" / "manifest.json").decode()
    lengths = {int(s["__key__"][4:]): s["tokens.npy"].size for s in a}
    assert all(counts[t] <= lengths[t] for t in counts), "a token given twice"
    assert sum(counts.values()) > 0.5 * sum(lengths.values())
