"""Counts say what happened (issue 29, class 7): ``samples`` is what reached the training
loop, ``filtered_samples`` what a select refused, ``dropped_samples`` what a rank's share
held that the shared epoch end cut off; each equal to a count made from the sample keys."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from tests.helpers.ranks import run_ranks

N = 60


def keep(sample: dict[str, Any]) -> bool:
    """Most of the first half, a quarter of the second (a rank's share filters unevenly)."""
    i = int(str(sample["__key__"]))
    return i % 5 != 0 if i < N // 2 else i % 4 == 1


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("counts") / "set"
    with sk.ShardWriter(out, maxcount=7) as w:
        for i in range(N):
            w.write({"__key__": f"{i:04d}", "txt": b"x" * (i + 1)})
    return str(out / "manifest.json")


def pipeline(manifest: str, **split: Any) -> sk.ShardDataset:
    ds = sk.ShardDataset(manifest, shardshuffle=False)
    if split:
        ds = ds.split_by_node(**split)
    return ds.select(keep).map(key_of).batched(3, collate=list)


@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (2, "process"), (2, "thread")])
def test_samples_are_what_reached_the_loop_and_filtered_what_select_refused(
    manifest: str, workers: int, mode: str
) -> None:
    loader = sk.WebLoader(pipeline(manifest), num_workers=workers, worker_mode=mode)
    got = [k for batch in loader for k in batch]
    stats = loader.stats()
    refused = [f"{i:04d}" for i in range(N) if not keep({"__key__": f"{i:04d}"})]
    assert sorted(got) == sorted({f"{i:04d}" for i in range(N)} - set(refused))
    assert stats["samples"] == len(got) and stats["filtered_samples"] == len(refused) > 0
    assert stats["dropped_samples"] == 0
    assert sum(w["samples"] for w in stats["per_worker"]) == len(got)


def mixed(manifest: str, rank: int) -> sk.ShardDataset:
    """Two sources (the set twice, seeds apart), each filtered, mixed to the longest."""
    sets = [
        sk.ShardDataset(manifest, shardshuffle=False, seed=s)
        .split_by_node(rank=rank, world_size=2)
        .select(keep)
        for s in (1, 2)
    ]
    return sk.mix(sets, [1, 3], stop="longest").map(key_of).batched(3, collate=list)


def _rank(manifest: str, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = ("samples", "filtered_samples", "dropped_samples")
    for name, ds in (
        ("plain", pipeline(manifest, rank=rank, world_size=2)),
        ("mix", mixed(manifest, rank)),
    ):
        loader = sk.WebLoader(ds, sync=True)
        got = [k for batch in loader for k in batch]
        stats = loader.stats()
        out[name] = {"got": got, **{k: stats[k] for k in keys}}
    return out


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_dropped_samples_are_the_share_the_shared_epoch_end_cut_off(
    manifest: str, tmp_path: Path
) -> None:
    both = run_ranks(functools.partial(_rank, manifest), 2, tmp_path)
    mixes = [r["mix"] for r in both]
    assert sum(r["dropped_samples"] for r in mixes) > 0
    for rank, r in enumerate(mixes):  # each source's share, once delivered, refused or cut
        share = len(list(sk.ShardDataset(manifest).split_by_node(rank=rank, world_size=2)))
        assert r["samples"] == len(r["got"])
        assert r["samples"] + r["filtered_samples"] + r["dropped_samples"] == 2 * share
    ranks = [r["plain"] for r in both]
    assert -(-len(ranks[0]["got"]) // 3) == -(-len(ranks[1]["got"]) // 3)  # the shared end
    assert sum(r["dropped_samples"] for r in ranks) > 0
    for rank, r in enumerate(ranks):
        share = [
            key_of(s)
            for s in sk.ShardDataset(manifest, shardshuffle=False).split_by_node(
                rank=rank, world_size=2
            )
        ]
        last = share.index(r["got"][-1])
        before, after = share[: last + 1], share[last + 1 :]
        assert r["samples"] == len(r["got"]) == sum(keep({"__key__": k}) for k in before)
        if any(keep({"__key__": k}) for k in after):  # cut off by the other rank's end
            assert r["filtered_samples"] == sum(not keep({"__key__": k}) for k in before)
            assert r["dropped_samples"] == len(after) > 0
        else:  # its own data ended: what followed its last sample was all refused
            assert r["filtered_samples"] == sum(not keep({"__key__": k}) for k in share)
            assert r["dropped_samples"] == 0
        assert r["samples"] + r["filtered_samples"] + r["dropped_samples"] == len(share)
