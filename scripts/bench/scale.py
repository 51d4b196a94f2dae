"""Cost against size: how shardkit's per-process and per-shard costs grow (issue 10).

Rows, each a median of ``--repeats`` runs, with the growth exponent between the smallest
and the largest size (``cost ~ size ** k``; 0 is flat, 1 linear):

1. ``open``: a fresh process opens a manifest of 10k / 100k / 1M shards, splits for rank
   4095 of 4096 and knows ``len()`` and the per-worker lengths (8 workers): seconds and
   RSS over the same process idle (numpy, shardkit imported). The compact form is built
   on the first open (its cost is shown apart); ``--json-too`` also times the parse of
   manifest.json for reference (17.6 s, 1.35 GB at 1M before the compact form).
2. ``plan``: one ``(rank, worker)`` stream at 1M shards for 8 .. 4096 ranks x 8 workers.
3. ``elastic``: a 4096 x 8 generation (ranks out of step) resumed on 2048 ranks, at
   10k / 100k / 1M shards, without a shuffle window and with one of 1,000 and 10,000.
4. ``writer``: per-shard time of ``ShardWriter``, first vs last 1,000 of ``--shards``
   one-sample shards (a flat cost has a ratio near 1).
5. ``cache``: the node cache's bookkeeping with 10 / 1,000 / 10,000 cached files, in one
   process (the eviction lock held by nobody else): ``hit_ms``, an open of a cached shard;
   ``miss_ms``, a reservation of a new temp file (then given up); ``evict_ms``, a
   reservation in a full cache that evicts the least recently used shard (then the new one
   published, so the count stays); ``first_ms``, the first reservation of a fresh store
   object (a new process's first open, the dir used before). CPU time of the process (the
   system calls included, waits for the disk not: publishing fsyncs a directory).
6. ``tools`` (only with ``--only``): ``manifest merge`` of 8 parts, ``verify --quick``
   and ``inspect`` of as many real one-sample shards, each a fresh CLI process: wall
   and CPU seconds.
7. ``pieces`` (only with ``--only``): ``open`` for a manifest of 1 GB shards with
   ``--pieces`` piece checksums each, its compact form written by the build
   (``save_manifest``, timed as ``save_s``) beside manifest.json.

    .venv/bin/python scripts/bench/scale.py --repeats 3 [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from shardkit.plan.assign import PlanConfig, worker_stream
from shardkit.plan.generation import Generation

_OPEN = r"""
import json, os, sys, time
import numpy
import shardkit as sk
from shardkit.streaming.dataset import ShardDataset  # torch too: the idle process has it

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
idle = rss()
t = time.perf_counter()
ds = ShardDataset(sys.argv[1], seed=1).split_by_node(rank=4095, world_size=4096)
n = len(ds)
per_worker = ds.lengths(8)
secs = time.perf_counter() - t
print(json.dumps({"secs": secs, "rss": rss() - idle, "len": n, "workers": per_worker}))
"""


def write_manifest(n: int, out: str) -> str:
    """A manifest.json of ``n`` shards as the build writes them (without piece lists)."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(n)
    counts = rng.integers(900, 1100, n)
    digests = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    path = os.path.join(out, "manifest.json")
    with open(path, "w") as f:
        f.write('{"format": "shardkit.manifest", "version": 1, "checksum_algorithm": "sha256",\n')
        f.write(f' "total_samples": {int(counts.sum())}, "total_bytes": {n * 1_000_000_000},\n')
        f.write(' "fields": {}, "created": {}, "shards": [\n')
        for i in range(n):
            sep = ",\n" if i + 1 < n else "\n"
            f.write(
                f'{{"url": "data-{i:07d}.tar", "size": 1000000000, "nsamples": {counts[i]}, '
                f'"checksum": "sha256:{digests[i].tobytes().hex()}", '
                f'"index": "data-{i:07d}.tar.idx"}}{sep}'
            )
        f.write("]}\n")
    return path


def _open_once(path: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _OPEN, path], check=True, capture_output=True, text=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def exponent(sizes: list[int], costs: list[float]) -> float:
    """The growth exponent between the smallest and the largest size."""
    if len(sizes) < 2 or min(costs[0], costs[-1]) <= 0:
        return float("nan")
    return math.log(costs[-1] / costs[0]) / math.log(sizes[-1] / sizes[0])


def bench_open(sizes: list[int], repeats: int, tmp: str, json_too: bool) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        path = write_manifest(n, os.path.join(tmp, f"m{n}"))
        first = _open_once(path)  # builds the compact form beside manifest.json
        runs = [_open_once(path) for _ in range(repeats)]
        row = {
            "shards": n,
            "first_open_s": first["secs"],
            "open_s": statistics.median(r["secs"] for r in runs),
            "rss_mb": statistics.median(r["rss"] for r in runs) / 1e6,
            "len": runs[0]["len"],
        }
        if json_too:
            os.rename(path + ".cols", path + ".cols.off")
            os.chmod(os.path.dirname(path), 0o555)  # no form can be built: the JSON parse
            try:
                ref = _open_once(path)
            finally:
                os.chmod(os.path.dirname(path), 0o755)
            row.update(json_s=ref["secs"], json_rss_mb=ref["rss"] / 1e6)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


_CFG = PlanConfig(seed=1)


def _with_pieces(n: int, per: int) -> Any:
    """A manifest of ``n`` 1 GB shards in ``per`` pieces each, in memory (as a writer has it)."""
    from shardkit.format.manifest.model import Manifest, ShardEntry
    from shardkit.format.pieces import Pieces

    rng = np.random.default_rng(n)
    counts = rng.integers(900, 1100, n)
    size = 1_000_000_000
    piece = -(-size // per)
    entries = []
    for i in range(n):
        raw = rng.bytes(32 + 16 * per).hex()
        entries.append(
            ShardEntry(
                f"data-{i:07d}.tar",
                size,
                int(counts[i]),
                "sha256:" + raw[:64],
                f"data-{i:07d}.tar.idx",
                pieces=Pieces(piece, tuple(raw[64 + 32 * k : 96 + 32 * k] for k in range(per))),
            )
        )
    return Manifest(shards=entries)


def bench_pieces(n: int, per: int, repeats: int, tmp: str) -> dict[str, Any]:
    """Open (as ``open``) a manifest whose shards list ``per`` piece checksums each, its
    compact form written by the build (``save_manifest``), not by the first reader."""
    from shardkit.format.manifest.compact import save_manifest

    out = os.path.join(tmp, f"p{n}")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "manifest.json")
    m = _with_pieces(n, per)
    t = time.perf_counter()
    save_manifest(m, path, csv_too=False)
    write_s = time.perf_counter() - t
    del m
    runs = [_open_once(path) for _ in range(repeats)]
    row = {
        "shards": n,
        "pieces_per_shard": per,
        "json_mb": os.path.getsize(path) / 1e6,
        "cols_mb": os.path.getsize(path + ".cols") / 1e6,
        "save_s": write_s,
        "open_s": statistics.median(r["secs"] for r in runs),
        "rss_mb": statistics.median(r["rss"] for r in runs) / 1e6,
        "load": os.getloadavg()[0],
    }
    print(json.dumps(row), flush=True)
    return row


def write_tiny_shards(n: int, out: str, parts: int = 8) -> list[str]:
    """``n`` real one-sample shards in ``out`` and ``parts`` partial manifests of them."""
    import hashlib

    from shardkit.format.tario.writer import END_OF_ARCHIVE, member_header, padding

    os.makedirs(out, exist_ok=True)
    entries = []
    for i in range(n):
        data = str(i).encode()
        raw = member_header(f"k{i:07d}.txt", len(data)) + data + padding(len(data))
        raw += END_OF_ARCHIVE
        with open(os.path.join(out, f"data-{i:07d}.tar"), "wb") as f:
            f.write(raw)
        sha = "sha256:" + hashlib.sha256(raw).hexdigest()
        entries.append(
            {"url": f"data-{i:07d}.tar", "size": len(raw), "nsamples": 1, "checksum": sha}
        )
    per, paths = -(-n // parts), []
    for p in range(parts):
        chunk = entries[p * per : (p + 1) * per]
        doc = {"format": "shardkit.manifest", "version": 1, "checksum_algorithm": "sha256",
               "fields": {"txt": {"count": len(chunk), "bytes": 0}}, "created": {},
               "part": {"index": p, "count": parts}, "shards": chunk}  # fmt: skip
        doc["fields"]["txt"]["bytes"] = sum(
            len(str(i)) for i in range(p * per, p * per + len(chunk))
        )
        paths.append(os.path.join(out, f"part-{p:02d}.json"))
        with open(paths[-1], "w") as f:
            json.dump(doc, f)
    return paths


def _cli(args: list[str], cwd: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one ``shardkit`` command."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shardkit", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_tools(sizes: list[int], repeats: int, tmp: str) -> list[dict[str, Any]]:
    """``manifest merge`` (8 parts), ``verify --quick`` and ``inspect`` of ``n`` real tiny
    shards, each a fresh ``shardkit`` process (its start, about 0.5 s of CPU, included)."""
    rows = []
    for n in sizes:
        out = os.path.join(tmp, f"t{n}")
        parts = [os.path.basename(p) for p in write_tiny_shards(n, out)]
        commands = {
            "merge": ["manifest", "merge", *parts, "-o", "manifest.json"],
            "verify_quick": ["verify", "--quick", "--no-progress", "manifest.json"],
            "inspect": ["inspect", "manifest.json"],
        }
        row: dict[str, Any] = {"shards": n}
        for name, args in commands.items():
            runs = [_cli(args, out) for _ in range(repeats)]
            row[f"{name}_s"] = statistics.median(r[0] for r in runs)
            row[f"{name}_cpu_s"] = statistics.median(r[1] for r in runs)
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _generation(counts: np.ndarray, world: int, workers: int, bufsize: int | None) -> Generation:
    rng = np.random.default_rng(world)
    per = int(counts.sum()) // world // workers
    pos = tuple(tuple(int(x) for x in rng.integers(0, per, workers)) for _ in range(world))
    return Generation(world, workers, pos, bufsize, None)


def _time(fn: Any, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def bench_plan(n: int, repeats: int) -> list[dict[str, Any]]:
    counts = np.random.default_rng(0).integers(900, 1100, n)
    cfg = PlanConfig(seed=1)
    rows = []
    for world in (8, 64, 512, 4096):
        secs = _time(lambda w=world: worker_stream(counts, cfg, 0, w, w - 1, 8, 7), repeats)
        rows.append({"shards": n, "ranks": world, "stream_s": secs})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_elastic(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for bufsize in (None, 1000, 10000):
        for n in sizes:
            counts = np.random.default_rng(0).integers(900, 1100, n)
            gen = _generation(counts, 4096, 8, bufsize)
            secs = _time(
                lambda c=counts, g=gen: worker_stream(c, _CFG, 0, 2048, 2047, 8, 7, (g,)), repeats
            )
            rows.append({"shards": n, "bufsize": bufsize, "replan_s": secs})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_writer(nshards: int, tmp: str) -> dict[str, Any]:
    from shardkit.write.writer import ShardWriter

    out = os.path.join(tmp, "w")
    times = []
    with ShardWriter(out, prefix="data", maxcount=1) as w:
        for i in range(nshards):
            t = time.perf_counter()
            w.write({"__key__": f"k{i:07d}", "txt": "x"})
            times.append(time.perf_counter() - t)
    first, last = sum(times[:1000]) / 1000, sum(times[-1000:]) / 1000
    row = {"shards": nshards, "first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first}
    print(json.dumps(row), flush=True)
    return row


def _cache_files(root: str, n: int, size: int) -> list[Any]:
    """A cache dir holding ``n`` published shards of ``size`` bytes, oldest first."""
    from shardkit.cache.layout import CacheKey
    from shardkit.cache.store import CacheStore

    store = CacheStore(root)
    store.ensure()
    keys = []
    for i in range(n):
        key = CacheKey.of(f"sha256:{i:064x}", size)
        path = store.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(bytes(size))
        os.utime(path, (1e9 + i, 1e9 + i))
        keys.append(key)
    return keys


def bench_cache(sizes: list[int], repeats: int, tmp: str) -> list[dict[str, Any]]:
    """The cost of an open, a reservation and an eviction against the files cached (CPU
    time of this process: system calls included, waits for the disk not)."""
    from shardkit.cache.layout import CacheKey
    from shardkit.cache.store import CacheStore

    def cpu(fn: Any) -> float:
        t = time.process_time()
        fn()
        return time.process_time() - t

    size, rows = 100, []
    for n in sizes:
        root = os.path.join(tmp, f"cache{n}")
        keys = _cache_files(root, n, size)
        store, free = CacheStore(root, limit=n * size), CacheStore(root)
        fresh = CacheKey.of("sha256:" + "f" * 64, 1)  # a miss
        _reserve(free, fresh)  # the first use of the dir (with a ledger: its first scan)
        first = [cpu(lambda r=root, k=fresh: _reserve(CacheStore(r), k)) for _ in range(5)]
        hit, miss, evict = [], [], []
        for r in range(max(repeats, 5)):
            hit.append(cpu(lambda s=store, k=keys[n // 2]: _hit(s, k)))
            new = CacheKey.of(f"sha256:{n + 1 + r:064x}", size - 1)  # its map: 1 byte
            miss.append(cpu(lambda s=free, k=new: _reserve(s, k)))
            evict.append(cpu(lambda s=store, k=new: _evict_and_publish(s, k)))
        row = {
            "files": n,
            "hit_ms": statistics.median(hit) * 1e3,
            "miss_ms": statistics.median(miss) * 1e3,
            "evict_ms": statistics.median(evict) * 1e3,
            "first_ms": statistics.median(first) * 1e3,
            "load": os.getloadavg()[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _hit(store: Any, key: Any) -> None:
    """An open of a cached shard, touched as a reader touches it."""
    from shardkit.cache.layout import FillPieces

    fd, published = store.open_part(key, FillPieces(key.size))
    assert fd is not None and published
    os.utime(fd)  # as a reader does: it is the most recently used now
    os.close(fd)


def _evict_and_publish(store: Any, key: Any) -> None:
    """A reservation in a full cache (it evicts), then the shard published."""
    from shardkit.cache.layout import FillPieces

    fd, _ = store.open_part(key, FillPieces(key.size))
    assert fd is not None
    os.ftruncate(fd, key.size)
    os.close(fd)
    store.publish(key, FillPieces(key.size))


def _reserve(store: Any, key: Any) -> None:
    """A reservation of a temp file for ``key``, given up at once."""
    from shardkit.cache.layout import FillPieces

    fd, _ = store.open_part(key, FillPieces(key.size))
    assert fd is not None
    os.close(fd)
    store.discard(key, FillPieces(key.size))


def _row(name: str, sizes: list[int], vals: list[float]) -> None:
    cells = "  ".join(f"{v:9.4f}" for v in vals)
    print(f"  {name:14s} {cells}   k={exponent(sizes, vals):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--writer-shards", type=int, default=10000)
    ap.add_argument("--json-too", action="store_true", help="also time the JSON parse")
    ap.add_argument("--cache-sizes", default="10,1000,10000", help="cached files")
    ap.add_argument("--only", default="open,plan,elastic,writer,cache")
    ap.add_argument("--pieces", type=int, default=16, help="piece checksums per shard")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    only = set(args.only.split(","))
    cache_sizes = [int(s) for s in args.cache_sizes.split(",")]
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "open" in only:
            res["open"] = bench_open(sizes, args.repeats, tmp, args.json_too)
        if "plan" in only:
            res["plan"] = bench_plan(sizes[-1], args.repeats)
        if "elastic" in only:
            res["elastic"] = bench_elastic(sizes, args.repeats)
        if "writer" in only:
            res["writer"] = bench_writer(args.writer_shards, tmp)
        if "cache" in only:
            res["cache"] = bench_cache(cache_sizes, args.repeats, tmp)
        if "tools" in only:
            res["tools"] = bench_tools(sizes, args.repeats, tmp)
        if "pieces" in only:
            res["pieces"] = [bench_pieces(n, args.pieces, args.repeats, tmp) for n in sizes]
    print("\ncost against size (k: cost ~ size**k between the smallest and largest)")
    if "open" in res:
        for key in ("open_s", "rss_mb", "first_open_s"):
            _row(key, sizes, [r[key] for r in res["open"]])
    if "plan" in res:
        _row(
            "plan (ranks)", [r["ranks"] for r in res["plan"]], [r["stream_s"] for r in res["plan"]]
        )
    if "elastic" in res:
        for bufsize in (None, 1000, 10000):
            vals = [r["replan_s"] for r in res["elastic"] if r["bufsize"] == bufsize]
            _row(f"replan b={bufsize}", sizes, vals)
    if "writer" in res:
        w = res["writer"]
        first, last = w["first_ms"], w["last_ms"]
        print(f"  writer per shard: first 1000 {first:.3f} ms, last 1000 {last:.3f} ms")
    if "cache" in res:
        for key in ("hit_ms", "miss_ms", "evict_ms", "first_ms"):
            _row(f"cache {key}", cache_sizes, [r[key] for r in res["cache"]])
    if "tools" in res:
        for key in ("merge", "verify_quick", "inspect"):
            for unit in ("_s", "_cpu_s"):
                _row(key + unit, sizes, [r[key + unit] for r in res["tools"]])
    if "pieces" in res:
        for key in ("open_s", "rss_mb", "save_s"):
            _row(f"pieces {key}", sizes, [r[key] for r in res["pieces"]])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
