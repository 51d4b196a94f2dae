"""Verify benchmark: shardkit.check.verify.verify vs plain hashing of the same files.

For each profile the samples are written once per algorithm (sha256 and xxh3_128) by
shardkit.ShardWriter; then, interleaved and repeated:

- ``shardkit verify`` at the default level (size + checksum of every byte) with
  ``jobs=1`` and ``jobs=2``, and at ``deep`` (also parse every shard) with ``jobs=1``;
- plain hashing of the same files: one thread reading 8 MB chunks into hashlib / xxhash
  (the single-core limit), and two threads (one file each at a time: the 2-core limit).

The figure of merit is shardkit's rate per job against the single-core hash rate. All
reads are warm page-cache reads (the shards were just written); ``--cold`` drops the page
cache before every timed run (root only).

    .bench-venv/bin/python scripts/bench/verify.py --size 1GB --repeats 3
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _peers
import xxhash
from _common import (
    Series,
    base_parser,
    before_runs,
    describe,
    finish,
    fmt,
    fresh_dir,
    interleave,
    log,
    make_dataset,
    parse_common,
    reads_note,
    table,
)

import shardkit
from shardkit.cache import make_opener
from shardkit.check.verify import verify

ALGOS: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}
_CHUNK = 8 << 20


def hash_file(path: str, algo: str) -> str:
    h = ALGOS[algo]()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return str(h.hexdigest())


def hash_files(paths: list[str], algo: str, threads: int) -> dict[str, int]:
    if threads == 1:
        for p in paths:
            hash_file(p, algo)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda p: hash_file(p, algo), paths))
    return {"problems": 0}


def run_verify(manifest: shardkit.Manifest, level: str, jobs: int) -> dict[str, int]:
    report = verify(manifest, level=level, jobs=jobs, opener=make_opener())
    if not report.ok:
        raise RuntimeError(f"verify found problems: {report.problems[:3]}")
    return {"problems": len(report.problems)}


def contenders(manifest_path: str, algo: str) -> list[tuple[str, Callable[[], Any]]]:
    manifest = shardkit.Manifest.load(manifest_path)
    paths = sorted(glob.glob(os.path.join(os.path.dirname(manifest_path), "*.tar")))
    return [
        (f"{algo} hash, 1 thread", lambda: hash_files(paths, algo, 1)),
        (f"{algo} hash, 2 threads", lambda: hash_files(paths, algo, 2)),
        (f"{algo} shardkit verify jobs=1", lambda: run_verify(manifest, "checksum", 1)),
        (f"{algo} shardkit verify jobs=2", lambda: run_verify(manifest, "checksum", 2)),
        (f"{algo} shardkit verify deep jobs=1", lambda: run_verify(manifest, "deep", 1)),
    ]


def report(series: dict[str, Series], nbytes: int) -> tuple[list[list[str]], list[dict[str, Any]]]:
    rows, records = [], []
    hashed: dict[tuple[str, int], float] = {}  # (algo, threads) -> plain hash rate
    for name, s in series.items():
        if " hash, " in name:
            hashed[(name.split()[0], int(name.split()[2]))] = nbytes / s.median
    for name, s in series.items():
        rate = nbytes / s.median
        jobs = 2 if ("jobs=2" in name or "2 threads" in name) else 1
        algo = name.split()[0]
        pct = rate / jobs / hashed[(algo, 1)] * 100
        same = rate / hashed[(algo, jobs)] * 100
        records.append(
            {
                "name": name,
                "median_s": s.median,
                "seconds": s.seconds,
                "mb_per_s": rate / 1e6,
                "jobs": jobs,
                "pct_single_core_per_job": pct,
                "pct_of_hash_same_threads": same,
            }
        )
        row = [name, fmt(s.median, ".3f"), fmt(rate / 1e6), str(jobs), fmt(pct, ".0f") + "%"]
        row.append(fmt(same, ".0f") + "%")
        rows.append(row)
    return rows, records


def main() -> None:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--cold", action="store_true", help="drop the page cache before runs")
    args = p.parse_args()
    parse_common(args)
    before = before_runs(args.cold)
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    texts = []
    for profile in args.profile_list:
        ds = make_dataset(profile, args.size_bytes)
        rows, records, nbytes = [], [], 0
        for algo in ALGOS:
            out = fresh_dir(os.path.join(args.work, "verify", profile, algo))
            _peers.write_shardkit(ds, out, args.shard_bytes, algo)
            manifest_path = os.path.join(out, "manifest.json")
            nbytes = shardkit.Manifest.load(manifest_path).total_bytes
            log(f"verify: {describe(ds)}, {algo}, {nbytes / 1e6:.0f} MB of shards")
            series = interleave(args.repeats, contenders(manifest_path, algo), before=before)
            r, rec = report(series, nbytes)
            rows += r
            records += rec
        head = ["contender", "median s", "MB/s", "jobs", "% of 1-core hash per job"]
        head.append("% of hash, same threads")
        texts.append(f"### verify, {describe(ds)}, {nbytes / 1e6:.0f} MB of shards\n\n")
        texts[-1] += table(head, rows) + "\n"
        results["profiles"][profile] = {"shard_bytes": nbytes, "contenders": records}
        del ds
    finish(args.out, "verify", results, texts, reads_note(args.repeats, args.cold))


if __name__ == "__main__":
    main()
