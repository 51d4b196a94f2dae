"""Nodes simulated on one machine, each its own cache dir and group of real processes.

A node is ``ranks`` processes (each ``ShardDataset(url, cache_dir=node).split_by_node``
read through a ``WebLoader`` with ``workers`` DataLoader workers, one epoch) and its own
:class:`RangeServer` over the one data set, so the server's log is that node's origin
requests. Every process of every node starts at once, so they race for each shard.
Used by ``tests/cache/test_nodes.py`` and ``scripts/bench/nodes.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.helpers.servers import RangeServer, Record

__all__ = ["NodeCounts", "run_nodes"]

ROOT = Path(__file__).resolve().parents[2]
_RANK = r"""
import json, sys
import shardkit as sk
url, cache, rank, world, workers = sys.argv[1:6]
ds = sk.ShardDataset(url, seed=1, cache_dir=cache).split_by_node(int(rank), int(world))
loader = sk.WebLoader(ds, num_workers=int(workers))
print(json.dumps([s["__key__"] for s in loader]))
"""
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class NodeCounts:
    """One node's requests to the origin, by kind, and the shard bytes it got."""

    processes: int  # ranks x (workers or 1)
    manifest: int
    shards: int  # ranged (or whole) GETs of shard bytes
    indexes: int
    other: int
    shard_bytes: int
    twice_bytes: int  # shard bytes this node asked for more than once
    shards_touched: int

    @property
    def total(self) -> int:
        return self.manifest + self.shards + self.indexes + self.other

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def _span(rec: Record) -> tuple[int, int]:
    m = _RANGE.match(rec.range or "")
    start = int(m.group(1)) if m else 0
    return start, start + rec.sent


def count(log: list[Record], processes: int) -> NodeCounts:
    """What a node's server log says (GETs only)."""
    gets = [r for r in log if r.method == "GET"]
    spans: dict[str, list[tuple[int, int]]] = {}
    kinds = {"manifest": 0, "shards": 0, "indexes": 0, "other": 0}
    for r in gets:
        if r.path.endswith("manifest.json"):
            kinds["manifest"] += 1
        elif r.path.endswith(".tar"):
            kinds["shards"] += 1
            spans.setdefault(r.path, []).append(_span(r))
        elif r.path.endswith(".idx"):
            kinds["indexes"] += 1
        else:
            kinds["other"] += 1
    twice = 0
    for parts in spans.values():
        end = 0
        for a, b in sorted(parts):
            twice += max(0, min(b, end) - a)
            end = max(end, b)
    got = sum(b - a for parts in spans.values() for a, b in parts)
    return NodeCounts(processes, **kinds, shard_bytes=got, twice_bytes=twice,
                      shards_touched=len(spans))  # fmt: skip


def run_nodes(
    data: str | os.PathLike[str], cache_root: str | os.PathLike[str], nodes: int, ranks: int,
    workers: int, *, timeout: float = 600.0,
) -> tuple[list[NodeCounts], list[str]]:  # fmt: skip
    """Run one epoch on ``nodes`` nodes of ``ranks`` x ``workers`` processes over the data
    set in ``data`` (its ``manifest.json``); each node's counts, and every key read."""
    servers = [RangeServer(data).start() for _ in range(nodes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        procs = []
        for n in range(nodes):
            cache = os.path.join(os.fspath(cache_root), f"node{n}")
            for r in range(ranks):
                args = [
                    servers[n].url("manifest.json"),
                    cache,
                    n * ranks + r,
                    nodes * ranks,
                    workers,
                ]
                cmd = [sys.executable, "-c", _RANK, *map(str, args)]
                pipe = subprocess.PIPE
                procs.append(subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe))
        keys: list[str] = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"a rank failed: {err.decode()[-2000:]}")
            keys += json.loads(out.decode().strip().splitlines()[-1])
        per = ranks * max(workers, 1)
        return [count(list(s.log), per) for s in servers], keys
    finally:
        for s in servers:
            s.stop()
