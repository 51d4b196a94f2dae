"""Issue 32 item 4: startup costs one manifest request per node, none per worker. A node
of 2 ranks x 2 DataLoader workers (one cache dir, real processes) reads an epoch from a
request-counting server by an http url, and one of 2 ranks x 1 worker by ``hf://``
(HF_ENDPOINT pointed at it): each node asks for the manifest once, and builds its compact
form once, in its cache dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.format.manifest.model import Manifest
from tests.helpers.nodes import count
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HUB = "datasets/org/set/resolve/main"
_RANK = r"""
import json, sys
import shardkit as sk
url, cache, rank, world, workers = sys.argv[1:6]
ds = sk.ShardDataset(url, seed=1, cache_dir=cache).split_by_node(int(rank), int(world))
print(json.dumps([s["__key__"] for s in sk.WebLoader(ds, num_workers=int(workers))]))
"""


@pytest.mark.timeout(120)
def test_a_node_of_ranks_and_workers_asks_for_the_manifest_once(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([10] * 8, tokens=100, subdir=HUB)
    served = Path(m.base or "").parents[4]
    ranks = 2
    with RangeServer(served) as web, RangeServer(served) as hub:
        runs = {
            "http": (web, web.url(f"{HUB}/manifest.json"), {}, 2),
            "hf": (hub, "hf://datasets/org/set/manifest.json", {"HF_ENDPOINT": hub.url()}, 1),
        }
        procs = {}
        for name, (_, url, env, workers) in runs.items():
            cache = str(tmp_path / name)
            full = {**os.environ, "PYTHONPATH": str(ROOT), "HF_TOKEN": "", **env}
            procs[name] = [
                subprocess.Popen(
                    [sys.executable, "-c", _RANK, url, cache, str(r), str(ranks), str(workers)],
                    env=full,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                for r in range(ranks)
            ]
        for name, ps in procs.items():
            keys = []
            for p in ps:
                out, err = p.communicate(timeout=100)
                assert p.returncode == 0, err.decode()[-2000:]
                keys += json.loads(out.decode().strip().splitlines()[-1])
            assert sorted(keys) == sorted({f"sample-{i:08d}" for i in range(80)})
            node = count(list(runs[name][0].log), ranks * runs[name][3])
            assert node.manifest == 1, (name, node)  # one per node: none per rank or worker
            assert node.indexes <= node.shards_touched and node.other == 0, (name, node)
            forms = os.listdir(tmp_path / name / "manifest-cols")
            assert len([f for f in forms if not f.endswith(".lock")]) == 1, forms
