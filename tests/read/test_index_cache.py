"""Sample indexes go through the node cache like shards: a later epoch makes no request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.format.manifest.model import Manifest
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


def _keys(ds: sk.ShardDataset) -> list[str]:
    return [s["__key__"] for s in ds]


def test_split_shards_read_their_index_once_per_node(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([7, 5, 9], subdir="ds")
    assert all(s.index_checksum for s in m.shards)
    assert m.base is not None
    with RangeServer(m.base) as server:

        def rank(r: int) -> sk.ShardDataset:
            return sk.ShardDataset(
                server.url("manifest.json"), cache_dir=str(tmp_path / "cache"), seed=3
            ).split_by_node(rank=r, world_size=2)

        ranks = [rank(0), rank(1)]
        first = [_keys(ds) for ds in ranks]
        # 21 samples on 2 ranks: shards are split by sample range, so offsets are needed
        assert len(first[0]) == len(first[1]) == 10
        assert len(set(first[0]) | set(first[1])) == 20
        idx_requests = server.requests("*.idx")
        assert idx_requests, "a split shard must be read from an index offset"
        assert len({r.path for r in idx_requests}) == len(idx_requests)  # each index once
        before = len(server.requests())
        for ds in ranks:
            ds.set_epoch(1)
        second = [_keys(ds) for ds in ranks]
        assert len(set(second[0]) | set(second[1])) == 20  # all of it from the node cache
        assert len(server.requests()) == before
        fresh = rank(0)  # another process on the node: the cached copies serve it too
        fresh.set_epoch(1)
        assert _keys(fresh) == second[0]
        assert len(server.requests()) == before
