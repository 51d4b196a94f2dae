"""gs:// and az:// under the DDP contract: 2 spawned gloo ranks on one node, 2 DataLoader
workers each, one node cache, against the GCS emulator and Azurite on 127.0.0.1. The first job
reads every sample once with equal batches per rank and fills the cache; the second job reads
the next epoch with the shard objects deleted from the store, so every byte it gets comes from
the node cache (checked against the cache again, not trusted)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest
from tests.helpers.ranks import run_ranks
from tests.helpers.readback import read_samples
from tests.helpers.stores import Store, azurite, gcs_emulator

pytestmark = pytest.mark.integration

SIZES = [7, 12, 5, 9]  # 33 samples
WORLD = 2


def _rank(url: str, cache: str, epoch: int, rank: int) -> dict[str, Any]:
    ds = ShardDataset(url, seed=3, cache_dir=cache).split_by_node()
    ds = ds.to_tuple("__key__", "tokens.npy").batched(4)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    loader.set_epoch(epoch)
    got: list[tuple[str, str]] = []
    steps = 0
    for keys, tokens in loader:
        got += [(k, hashlib.sha256(t).hexdigest()) for k, t in zip(keys, tokens, strict=True)]
        steps += 1
        dist.all_reduce(torch.ones(1))  # hangs if a rank has fewer batches
    return {"steps": steps, "len": len(loader), "got": got}


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    emulator = gcs_emulator if request.param == "gs" else azurite
    with emulator() as s:
        yield s


def _job(store: Store, cache: Path, epoch: int, out: Path) -> list[dict[str, Any]]:
    out.mkdir()
    fn = functools.partial(_rank, store.url("ds/manifest.json"), str(cache), epoch)
    return run_ranks(fn, WORLD, out)  # the spawned ranks inherit the store's env


def test_two_ranks_two_workers_read_a_bucket_once_then_from_the_node_cache(
    make_shards: Callable[..., Manifest], store: Store, tmp_path: Path
) -> None:
    m = make_shards(SIZES, tokens=2000, subdir="ds")
    store.upload_dir(Path(str(m.base)), "ds")
    want = sorted(
        (str(s["__key__"]), hashlib.sha256(s["tokens.npy"]).hexdigest()) for s in read_samples(m)
    )
    cache = tmp_path / "node-cache"
    try:
        for epoch in (0, 1):
            ranks = _job(store, cache, epoch, tmp_path / f"epoch{epoch}")
            steps = {r["steps"] for r in ranks}
            assert len(steps) == 1 and steps == {r["len"] for r in ranks}, ranks
            got = sorted(tuple(pair) for r in ranks for pair in r["got"])
            # every sample once per epoch under the equal-batch contract (a rank's share
            # rounded down to whole batches: what is dropped is dropped on every rank alike)
            assert len(got) == len(set(got)) == 4 * WORLD * steps.pop()
            assert set(got) <= set(want), f"{store.scheme}: bytes the store never held"
            assert len(want) - len(got) < 4 * WORLD
            if epoch == 0:
                cached = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 0]
                assert sum(p.stat().st_size for p in cached) >= sum(e.size for e in m.shards)
                for e in m.shards:  # the next epoch can only be served by the node cache
                    key = f"ds/{e.url}"
                    if store.scheme == "gs":
                        store.client.bucket(store.bucket).blob(key).delete()
                    else:
                        store.client.get_container_client(store.bucket).delete_blob(key)
                assert not [n for n in store.names() if n.endswith(".tar")]
    finally:
        store.clear()
