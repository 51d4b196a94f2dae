"""Origin requests per node against the processes on it (issue 10, item 5), measured.

Simulated nodes on one machine: each its own cache dir, its own group of real processes
(``ranks`` processes running ``ShardDataset(...).split_by_node`` + ``WebLoader`` with
``workers`` DataLoader workers) and its own request-counting HTTP server on 127.0.0.1
(``tests/helpers/nodes.py``), all reading one epoch of the same data set at once. Printed:
per node (median over nodes) the manifest, shard and sample-index requests, shard MB
fetched and bytes fetched twice, for each ranks x workers.

    .venv/bin/python scripts/bench/nodes.py [--nodes 4] [--shards 32] [--configs 1x0,1x2,2x2,4x2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.helpers.data import make_shards
from tests.helpers.nodes import run_nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--samples", type=int, default=20, help="samples per shard")
    ap.add_argument("--piece-size", type=int, default=16384)
    ap.add_argument("--configs", default="1x0,1x2,2x2,4x2", help="ranks x workers per node")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        m = make_shards(os.path.join(tmp, "data"), [args.samples] * args.shards, tokens=2000,
                        piece_size=args.piece_size)  # fmt: skip
        pieces = len(m.shards[0].pieces.digests) if m.shards[0].pieces else 0
        print(f"{len(m)} shards of {m.shards[0].size / 1e3:.0f} KB, {pieces} pieces each")
        for spec in args.configs.split(","):
            ranks, workers = (int(x) for x in spec.split("x"))
            t = time.perf_counter()
            nodes, keys = run_nodes(os.path.join(tmp, "data"), os.path.join(tmp, f"c{spec}"),
                                    args.nodes, ranks, workers)  # fmt: skip
            assert len(keys) == len(set(keys)), "a sample was read twice"

            def med(key: str, nodes: list[Any] = nodes) -> float:
                return float(statistics.median(getattr(n, key) for n in nodes))

            row = {
                "nodes": args.nodes,
                "ranks": ranks,
                "workers": workers,
                "processes_per_node": nodes[0].processes,
                "manifest": med("manifest"),
                "shards": med("shards"),
                "indexes": med("indexes"),
                "total": med("total"),
                "shards_touched": med("shards_touched"),
                "shard_mb": med("shard_bytes") / 1e6,
                "twice_bytes": max(n.twice_bytes for n in nodes),
                "samples": len(keys),
                "wall_s": time.perf_counter() - t,
                "load": os.getloadavg()[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\nper node (median of nodes): requests to the origin")
    print("  ranks x workers  processes  manifest  shard GETs  index GETs  total  shards  MB")
    for r in rows:
        print(f"  {r['ranks']:>5} x {r['workers']:<7} {r['processes_per_node']:>9} "
              f"{r['manifest']:>9.0f} {r['shards']:>11.0f} {r['indexes']:>11.0f} "
              f"{r['total']:>6.0f} {r['shards_touched']:>7.0f} {r['shard_mb']:>4.1f}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
