"""O(1) origin requests per node: nodes simulated as separate cache dirs and groups of
real processes (ranks, each with DataLoader workers) against request-counting servers.

Per node: one manifest request, every byte of a shard fetched once (each piece once),
at most one request per piece of the shards the node reads and one per sample index;
the same counts with 1 process per node as with 2 ranks x 2 workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.format.manifest.model import Manifest
from tests.helpers.nodes import run_nodes

pytestmark = pytest.mark.integration


def test_origin_requests_per_node_do_not_grow_with_its_processes(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([20] * 12, tokens=2000, piece_size=16384, subdir="data")
    pieces = max(len(s.pieces.digests) for s in m.shards if s.pieces is not None)
    assert pieces >= 4  # each shard comes in pieces
    seen = {}
    for ranks, workers in ((1, 0), (2, 2)):
        nodes, keys = run_nodes(m.base or "", tmp_path / f"c{ranks}", 2, ranks, workers)
        assert sorted(keys) == sorted(set(keys)) and len(keys) == m.total_samples
        for node in nodes:
            assert node.manifest == 1
            assert node.twice_bytes == 0  # no byte of a shard twice: each piece once
            assert node.shards <= node.shards_touched * pieces
            assert node.indexes <= node.shards_touched and node.other == 0
        seen[ranks * max(workers, 1)] = [(n.manifest, n.shard_bytes) for n in nodes]
    assert seen[1] == seen[4]  # the same origin traffic per node for 1 and 4 processes
