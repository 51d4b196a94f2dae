"""A job against a store that throttles (issue 32): the node's adaptive request rate
against the fixed request cap alone.

The setting of the issue: ``--nodes`` node processes (each its own cache dir, one rank,
``--workers`` DataLoader workers) read one epoch of ``--shards`` small shards at once from
one origin on 127.0.0.1 that serves ``--rate`` requests per second (a token bucket of
``--burst``; beyond it 429 with ``Retry-After: 1``, or a bare 503 as S3 does:
``tests/helpers/throttle.py``). Every node has made its loader before any starts its epoch.
For each answer mode, with and without adaptation (``rate_adapt``), interleaved over
``--reps`` repetitions: requests, the throttled share, the epoch's time (the origin's first
request after the start to its last) against the origin's own time (the requests it served
at its rate), and whether every sample came right. webdataset and litdata have no
per-node request gate to compare: they are not run (see the bench README).

    .venv/bin/python scripts/bench/throttle.py [--nodes 4 --workers 2 --shards 480 --rate 40]
        [--reps 1] [--out throttle.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.helpers.data import make_shards
from tests.helpers.throttle import MODES, ThrottlingServer, run_job


def _expected(data: str) -> list[tuple[str, str]]:
    """Every sample's key and json text, read from the local copy without a server."""
    from shardkit import ShardDataset

    ds = ShardDataset(os.path.join(data, "manifest.json"), seed=1)
    return sorted((s["__key__"], bytes(s["json"]).decode()) for s in ds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=480)
    ap.add_argument("--samples", type=int, default=4, help="samples per shard")
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s the origin serves")
    ap.add_argument("--burst", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        make_shards(data, [args.samples] * args.shards, tokens=16)
        want = _expected(data)
        for rep in range(args.reps):
            for mode in args.modes.split(","):
                for adapt in (False, True):
                    srv = ThrottlingServer(data, rate=args.rate, burst=args.burst, mode=mode)
                    with srv:
                        cache = os.path.join(tmp, f"cache-{rep}-{mode}-{adapt}")
                        opts = {"rate_adapt": adapt}
                        ep = run_job(srv, cache, args.nodes, args.workers, options=opts)
                    row = {"mode": mode, "adapt": adapt, "rep": rep, **ep.to_dict()}
                    row["x_origin"] = ep.seconds / ep.origin_seconds
                    row["samples_right"] = sorted(map(tuple, ep.rows)) == want
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"\n{'mode':12} {'adapt':6} {'requests':>8} {'throttled':>9} {'epoch s':>8} "
          f"{'origin s':>8} {'x origin':>8} right")  # fmt: skip
    for mode in args.modes.split(","):
        for adapt in (False, True):
            mine = [r for r in rows if r["mode"] == mode and r["adapt"] == adapt]
            keys = ("requests", "throttled_share", "seconds", "origin_seconds", "x_origin")
            med = {k: statistics.median(r[k] for r in mine) for k in keys}
            right = all(r["samples_right"] for r in mine)
            print(f"{mode:12} {adapt!s:6} {med['requests']:8.0f} {med['throttled_share']:9.1%} "
                  f"{med['seconds']:8.2f} {med['origin_seconds']:8.2f} {med['x_origin']:8.2f} "
                  f"{right}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
