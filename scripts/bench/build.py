"""Build benchmark: ``shardkit build`` from files vs a webdataset script vs the raw limit.

What a user does to turn a folder of files or a JSONL corpus into shards. The inputs are
generated once per profile, before any timing; every contender runs as its own process
(interpreter start-up counted for all), interleaved repetitions, medians:

- ``shardkit build`` through the CLI with ``--workers 1`` and ``--workers 2`` (tar shards,
  sha256 per shard, sample index, manifest, each shard fsynced before its rename).
- ``webdataset``: the script a webdataset user writes: walk the inputs, group files by key
  (folders) or read the lines (JSONL), ``webdataset.ShardWriter`` (no checksum, no fsync,
  no manifest).
- ``raw``: read every input byte, sha256 it and write it into one file, fsynced: the least
  a build with shardkit's guarantees must do.
- ``gnu tar``: ``tar -cf`` of the folder (folders only; no checksum, no fsync).

Profiles: ``images``: a folder tree of noise JPEGs (128x128, quality 90, ~25 KB) each with
a small ``.json``; ``jsonl``: records of ~2 KB text, one sample a line.

    .venv/bin/python scripts/bench/build.py --size 200MB --repeats 3 [--profiles images,jsonl]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from _common import (
    dir_bytes,
    finish,
    fresh_dir,
    interleave,
    log,
    rate_row,
    sync,
    table,
)

from shardkit.units import parse_size

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = ("images", "jsonl")

_WDS = r"""
import json, os, sys
import webdataset as wds
src, out, kind, maxsize = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.makedirs(out, exist_ok=True)
with wds.ShardWriter(os.path.join(out, "data-%06d.tar"), maxsize=maxsize, verbose=0) as w:
    if kind == "jsonl":
        for name in sorted(os.listdir(src)):
            with open(os.path.join(src, name), "rb") as f:
                for i, line in enumerate(f):
                    w.write({"__key__": f"{name}/{i:08d}", "json": line.rstrip(b"\n")})
    else:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            group = {}
            for name in sorted(files):
                key, ext = name.split(".", 1)
                group.setdefault(key, {})[ext] = os.path.join(root, name)
            for key, fields in group.items():
                sample = {"__key__": os.path.relpath(os.path.join(root, key), src)}
                for ext, path in fields.items():
                    with open(path, "rb") as f:
                        sample[ext] = f.read()
                w.write(sample)
"""


def make_images(out: str, total: int, seed: int = 0) -> int:
    """Noise JPEGs with a json each, 500 to a folder, until ``total`` bytes; their count."""
    from PIL import Image

    rng = random.Random(seed)
    made = 0
    size = 0
    pool = []
    for k in range(64):  # a pool of distinct images, reused: encoding is not what we time
        img = Image.frombytes("RGB", (128, 128), rng.randbytes(128 * 128 * 3))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        pool.append(buf.getvalue())
        del k
    while size < total:
        d = os.path.join(out, f"part{made // 500:04d}")
        os.makedirs(d, exist_ok=True)
        jpg = pool[made % len(pool)]
        meta = json.dumps({"id": made, "label": made % 1000, "caption": "noise " * 8}).encode()
        with open(os.path.join(d, f"{made:08d}.jpg"), "wb") as f:
            f.write(jpg)
        with open(os.path.join(d, f"{made:08d}.json"), "wb") as f:
            f.write(meta)
        size += len(jpg) + len(meta)
        made += 1
    return made


def make_jsonl(out: str, total: int, seed: int = 0) -> int:
    """JSONL files of ~2 KB text records (10,000 lines a file); their line count."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 9))) for _ in range(500)
    ]
    os.makedirs(out, exist_ok=True)
    made = size = 0
    f = None
    while size < total:
        if made % 10_000 == 0:
            if f is not None:
                f.close()
            f = open(os.path.join(out, f"part{made // 10_000:04d}.jsonl"), "wb")  # noqa: SIM115
        text = " ".join(rng.choice(words) for _ in range(330))
        line = json.dumps({"id": made, "text": text}).encode() + b"\n"
        f.write(line)
        size += len(line)
        made += 1
    if f is not None:
        f.close()
    return made


def raw_copy(src: str, out: str) -> None:
    """Every input byte read, sha256'd and written into one fsynced file."""
    h = hashlib.sha256()
    with open(os.path.join(out, "raw.bin"), "wb") as w:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(files):
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
                h.update(data)
                w.write(data)
        w.flush()
        os.fsync(w.fileno())
    h.hexdigest()


def _proc(cmd: list[str]) -> None:
    # a user's interpreter keeps its bytecode: start-up without it would be counted
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=_ROOT, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed:\n{r.stderr[-2000:]}")


def contenders(kind: str, src: str, work: str, shard: int) -> list[tuple[str, Callable[[], Any]]]:
    py = sys.executable

    def run(name: str, fn: Callable[[str], None]) -> tuple[str, Callable[[], Any]]:
        out = os.path.join(work, name.replace(" ", "-"))

        def go() -> dict[str, int]:
            fn(fresh_dir(out))
            return {"disk_bytes": dir_bytes(out)}

        return name, go

    def shardkit(workers: int) -> Callable[[str], None]:
        return lambda o: _proc(
            [py, "-m", "shardkit", "build", src, "-o", o, "--maxsize", str(shard),
             "--workers", str(workers), "--no-progress", "--overwrite"]
        )  # fmt: skip

    out = [
        run("shardkit build 1 worker", shardkit(1)),
        run("shardkit build 2 workers", shardkit(2)),
        run("webdataset script", lambda o: _proc([py, "-c", _WDS, src, o, kind, str(shard)])),
        run("raw read+sha256+write", lambda o: raw_copy(src, o)),
    ]
    if kind == "images":
        out.append(
            run("gnu tar -cf", lambda o: _proc(["tar", "-cf", f"{o}/all.tar", "-C", src, "."]))
        )
    return out


def report(n: int, payload: int, series: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    wds = series["webdataset script"].median
    raw = series["raw read+sha256+write"].median
    rows, records = [], []
    for s in series.values():
        rec, row = rate_row(s, n, payload, wds, raw, what="input")
        records.append(rec)
        rows.append(row)
    head = ["build", "median s", "samples/s", "input MB/s", "disk/input", "vs wds", "% raw"]
    return table(head, rows), records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="200MB", help="input bytes per profile")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profiles", default="images,jsonl")
    p.add_argument("--shard-size", default="64MB")
    p.add_argument("--work", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    profiles = [x for x in args.profiles.split(",") if x]
    for x in profiles:
        if x not in PROFILES:
            raise SystemExit(f"unknown profile {x!r}; choose from {', '.join(PROFILES)}")
    total, shard = parse_size(args.size), parse_size(args.shard_size)
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    texts = []
    for kind in profiles:
        src = fresh_dir(os.path.join(args.work, "build-src", kind))
        n = (make_images if kind == "images" else make_jsonl)(src, total)
        payload = dir_bytes(src)
        what = (
            f"{kind}: {n:,} samples, {payload / 1e6:.0f} MB of input, shards of {args.shard_size}"
        )
        log(f"build: {what}")
        work = os.path.join(args.work, "build", kind)
        series = interleave(args.repeats, contenders(kind, src, work, shard), before=sync)
        text, records = report(n, payload, series)
        texts.append(f"### build, {what}\n\n{text}\n")
        results["profiles"][kind] = {"samples": n, "input_bytes": payload, "contenders": records}
        fresh_dir(work)
        fresh_dir(src)
    load = os.getloadavg()[0]
    finish(args.out, "build", results, texts, f"medians of {args.repeats}; load {load:.1f}")


if __name__ == "__main__":
    main()
