"""What ``cache_verify="open"`` costs on a warm epoch (issue 9 item 10).

A shard set (``--size`` in ``--shard-size`` shards of 64 KB samples, 16 MiB pieces) is
served by the tests' RangeServer on 127.0.0.1 and read once through a node cache, which
then holds all of it. Then, interleaved, ``--repeats`` times each (medians; wall and CPU
seconds of this process):

- ``plain``: a warm epoch, ``ShardDataset(..., cache_verify="fill")`` (hits not re-hashed);
- ``open``: the same epoch with ``cache_verify="open"`` (every piece hashed, xxh3-128);
- ``open_whole``: the same with a manifest without pieces (each shard hashed whole,
  sha256, before its first byte is read);
- ``raw``: a sequential read of the same cached files (1 MiB reads), the limit.

Reads are warm page-cache reads (the set fits in memory).

    .venv/bin/python scripts/bench/recheck.py --size 256MB --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from shardkit.io import CacheConfig, IoConfig
from shardkit.streaming.dataset import ShardDataset
from shardkit.units import parse_size
from shardkit.write.writer import ShardWriter


def write_set(out: str, total: int, shard_size: int, pieces: bool) -> None:
    """``total`` bytes of 64 KB random samples in shards of ``shard_size``."""
    rng = os.urandom
    blob = 64 << 10
    kw: dict[str, Any] = {} if pieces else {"piece_size": None}
    with ShardWriter(out, prefix="data", maxsize=shard_size, **kw) as w:
        for i in range(total // blob):
            w.write({"__key__": f"s{i:08d}", "bin": rng(blob)})


def epoch(url: str, cache: str, verify: str) -> int:
    io = IoConfig(cache=CacheConfig(cache_dir=cache, cache_verify=verify))
    ds = ShardDataset(url, seed=0, shardshuffle=False, io=io)
    return sum(len(s["bin"]) for s in ds)  # type: ignore[arg-type]


def raw(cache: str) -> int:
    n = 0
    for d, _, names in os.walk(os.path.join(cache, "data")):
        for name in sorted(names):
            with open(os.path.join(d, name), "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    n += len(chunk)
    return n


def timed(fn: Callable[[], int]) -> tuple[float, float, int]:
    w, c = time.perf_counter(), time.process_time()
    n = fn()
    return time.perf_counter() - w, time.process_time() - c, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="256MB")
    ap.add_argument("--shard-size", default="64MB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    from tests.helpers.servers import RangeServer

    total, shard_size = parse_size(args.size), parse_size(args.shard_size)
    with tempfile.TemporaryDirectory() as tmp:
        for name, pieces in (("p", True), ("w", False)):
            write_set(os.path.join(tmp, "srv", name), total, shard_size, pieces)
        with RangeServer(os.path.join(tmp, "srv")) as srv:
            urls = {"p": srv.url("p/manifest.json"), "w": srv.url("w/manifest.json")}
            caches = {k: os.path.join(tmp, f"cache-{k}") for k in urls}
            for k in urls:
                epoch(urls[k], caches[k], "fill")  # fills the cache
            runs: dict[str, list[tuple[float, float, int]]] = {}
            cases: dict[str, Callable[[], int]] = {
                "plain": lambda: epoch(urls["p"], caches["p"], "fill"),
                "open": lambda: epoch(urls["p"], caches["p"], "open"),
                "open_whole": lambda: epoch(urls["w"], caches["w"], "open"),
                "raw": lambda: raw(caches["p"]),
            }
            for _ in range(args.repeats):
                for name, fn in cases.items():
                    runs.setdefault(name, []).append(timed(fn))
    res: dict[str, Any] = {"bytes": total, "load": os.getloadavg()[0], "rows": {}}
    print(f"warm epoch of {total / 1e6:.0f} MB, medians of {args.repeats}")
    print(f"  {'case':12s} {'wall s':>8s} {'cpu s':>8s} {'MB/s':>8s} {'x plain':>8s}")
    plain = statistics.median(r[0] for r in runs["plain"])
    for name, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        res["rows"][name] = {"wall_s": wall, "cpu_s": cpu, "mb_s": rs[0][2] / wall / 1e6}
        print(
            f"  {name:12s} {wall:8.3f} {cpu:8.3f} {rs[0][2] / wall / 1e6:8.0f} {wall / plain:8.2f}"
        )
    print(f"  load average {res['load']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
