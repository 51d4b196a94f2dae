"""The DDP data contract with real ranks: spawned processes, a gloo process group on
127.0.0.1, 2 DataLoader workers each, one collective per step standing for DDP's gradient
all-reduce (a short timeout: a rank with fewer batches fails the test instead of hanging).

Pipelines that make ranks consume at different rates: a filter over a damaged shard read
with ``handler="skip_shard"``, ``pack_tokens`` over documents of random length, a ``mix``
of two data sets, and the plain one. For each: equal batch counts on every rank, no sample
twice; exact resume through the README pattern (every rank calls ``state_dict()`` at the
same step, one state loaded on every rank) at several steps, also before every worker has
sent a batch, and through ``torch.distributed.checkpoint``; elastic 3 -> 2 and 2 -> 3 ranks
with a filter: nothing consumed is read again.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from shardkit import ShardDataset, WebLoader
from tests.helpers.ddp import (
    DOC_LENGTHS,
    contract_pipeline,
    free_port,
    ident,
    keep,
    kept,
    make_data,
)

pytestmark = pytest.mark.integration

WORKERS = 2
TIMEOUT = datetime.timedelta(seconds=30)


def pipeline(name: str, root: Path) -> ShardDataset:
    if name == "filter-skip":
        return contract_pipeline("filter", root, policy="skip_shard", damaged=True)
    return contract_pipeline(name, root)


def loader_for(name: str, root: Path, **kw: Any) -> WebLoader:
    ds = pipeline(name, root)
    return WebLoader(ds, num_workers=WORKERS, multiprocessing_context="fork", **kw)


def run(it: Any, steps: int | None = None) -> list[list[str]]:
    """Iterate with one collective per step (a gradient all-reduce stand-in)."""
    out = []
    for batch in it:
        dist.all_reduce(torch.ones(1))
        out.append(ident(batch))
        if steps is not None and len(out) == steps:
            break
    return out


def _init(rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT
    )


def _contract_rank(rank: int, world: int, port: int, root: str, names: list[str]) -> None:
    _init(rank, world, port)
    data = Path(root)
    results: dict[str, Any] = {}
    try:
        for name in names:
            unsynced = len(list(loader_for(name, data, sync=False)))  # no collective here
            first = loader_for(name, data)
            full = run(first)
            stats = first.stats()
            resumed = {}
            for stop in (0, 1, 5):  # 1: only worker 0 has sent a batch
                loader = loader_for(name, data)
                it = iter(loader)
                head = run(it, stop) if stop else []
                state = json.loads(json.dumps(loader.state_dict()))  # every rank, same step
                del it
                again = loader_for(name, data)
                again.load_state_dict(state)
                resumed[str(stop)] = {"head": head, "tail": run(again), "state": state}
            results[name] = {"full": full, "resumed": resumed, "stats": stats, "own": unsynced}
        # torch.distributed.checkpoint: the loader is Stateful
        loader = loader_for("filter-skip", data)
        it = iter(loader)
        head = run(it, 4)
        dcp.save({"data": loader}, checkpoint_id=str(data / "dcp"))
        del it
        again = loader_for("filter-skip", data)
        dcp.load({"data": again}, checkpoint_id=str(data / "dcp"))
        results["dcp"] = {"head": head, "tail": run(again)}
        # persistent workers across epochs that end early on some ranks
        ds = pipeline("filter-skip", data)
        kept_alive = WebLoader(
            ds, num_workers=WORKERS, multiprocessing_context="fork", persistent_workers=True
        )
        epochs = []
        for epoch in range(3):
            kept_alive.set_epoch(epoch)
            epochs.append(run(kept_alive))
        results["persistent"] = epochs
        if rank == 0:  # an evaluation set on rank 0 only: no collective, so no hang
            ev = ShardDataset(str(data / "plain" / "manifest.json"), seed=1).select(keep)
            evaluation = WebLoader(ev.to_tuple("__key__").batched(5))
            results["eval"] = [len(b[0]) for b in evaluation]
            results["eval_state"] = json.loads(evaluation.state_dict()["ranks"])
        dist.barrier()
        with open(data / f"contract-{rank}.json", "w", encoding="utf-8") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    mp.spawn(fn, args=(world, free_port(), *args), nprocs=world, join=True)


def _load(root: Path, stem: str, world: int) -> list[Any]:
    return [json.loads((root / f"{stem}-{r}.json").read_text()) for r in range(world)]


NAMES = ["plain", "filter-skip", "pack", "mix"]


def test_every_pipeline_keeps_ranks_equal_and_resumes_exactly(tmp_path: Path) -> None:
    make_data(tmp_path)
    _spawn(_contract_rank, 3, str(tmp_path), NAMES)
    ranks = _load(tmp_path, "contract", 3)
    for name in NAMES:
        steps = [len(r[name]["full"]) for r in ranks]
        assert len(set(steps)) == 1 and steps[0] > 0, f"{name}: batches per rank {steps}"
        own = [r[name]["own"] for r in ranks]  # each rank's own data, without the shared end
        assert steps[0] == min(own), f"{name}: the epoch ends with the first rank's data"
        if name in ("filter-skip", "pack"):
            assert len(set(own)) > 1, f"{name}: the ranks' data should differ in length"
        items = [x for r in ranks for b in r[name]["full"] for x in b]
        if name == "pack":  # no document's tokens twice: count each token id
            tokens = [int(t) for seq in items for t in seq.split()]
            counts = np.bincount(tokens, minlength=120)
            assert all(c <= n for c, n in zip(counts, DOC_LENGTHS, strict=True)), name
        else:
            assert len(set(items)) == len(items), f"{name}: a sample was read twice"
        for stop, res in ranks[0][name]["resumed"].items():
            for r in ranks:  # the state is the job's: the same on every rank
                assert r[name]["resumed"][stop]["state"] == res["state"], f"{name}@{stop}"
                got = r[name]["resumed"][stop]["head"] + r[name]["resumed"][stop]["tail"]
                assert got == r[name]["full"], f"{name}: resumed at step {stop} differs"
    for r in ranks:
        assert r["dcp"]["head"] + r["dcp"]["tail"] == r["filter-skip"]["full"]
        assert r["persistent"][0] == r["filter-skip"]["full"], "persistent workers differ"
    for epoch in range(3):
        counts = {len(r["persistent"][epoch]) for r in ranks}
        assert len(counts) == 1, f"epoch {epoch} with persistent workers: {counts}"
        items = [x for r in ranks for b in r["persistent"][epoch] for x in b]
        assert len(set(items)) == len(items)
    assert ranks[0]["persistent"][1] != ranks[0]["persistent"][2], "epochs should differ"
    assert sum(ranks[0]["eval"]) == len(kept()) and [e["rank"] for e in ranks[0]["eval_state"]] == [
        0
    ]
    # the damaged shard was skipped on some rank; every rank reports the job's skips
    mine = [r["filter-skip"]["stats"]["skipped_shards"] for r in ranks]
    job = {r["filter-skip"]["stats"]["job_skipped_shards"] for r in ranks}
    # every rank reports the same job count; a shard refused at open (verification,
    # issue 20) is refused by each rank that reads a range of it, counted once per shard
    assert sum(mine) >= 1 and len(job) == 1 and 1 <= min(job) <= sum(mine), (mine, job)


def _elastic_rank(rank: int, world: int, port: int, root: str, phase: str, stop: int) -> None:
    """Phase "save": run ``stop`` steps, save the job state. Phase "load": resume from it."""
    _init(rank, world, port)
    data = Path(root)
    try:
        loader = loader_for("filter", data)
        if phase == "save":
            it = iter(loader)
            got = run(it, stop)
            state = loader.state_dict()
            if rank == 0:
                (data / "elastic-state.json").write_text(json.dumps(state))
            del it
        else:
            loader.load_state_dict(json.loads((data / "elastic-state.json").read_text()))
            got = run(loader)
        with open(data / f"elastic-{phase}-{rank}.json", "w", encoding="utf-8") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


def test_elastic_resume_with_a_filter_across_world_sizes(tmp_path: Path) -> None:
    """3 -> 2 and 2 -> 3 ranks (2 workers each) with a filter: ranks stay equal, nothing
    consumed is read again, nothing is read twice."""
    make_data(tmp_path)
    for old, new in ((3, 2), (2, 3)):
        _spawn(_elastic_rank, old, str(tmp_path), "save", 3)
        _spawn(_elastic_rank, new, str(tmp_path), "load", 0)
        before = [x for r in _load(tmp_path, "elastic-save", old) for b in r for x in b]
        runs = _load(tmp_path, "elastic-load", new)
        after = [x for r in runs for b in r for x in b]
        assert len({len(r) for r in runs}) == 1 and runs[0], f"{old}->{new}: unequal ranks"
        assert not set(before) & set(after), f"{old}->{new}: consumed samples read again"
        assert len(set(after)) == len(after), f"{old}->{new}: a sample read twice"
        assert set(before) | set(after) <= kept()
        assert len(before) == old * 3 * 3  # 3 steps of 3 on every rank
