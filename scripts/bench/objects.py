"""Object-store build benchmark (issue 23): a build written straight to S3 (moto's server on
127.0.0.1) vs the same build to local disk vs what a webdataset user does (its ShardWriter to
local disk, then an upload of each finished shard) vs the raw limit (the same bytes uploaded
as one multipart object with the same part size) vs Ray Data's ``write_webdataset`` into the
bucket, and the read clients measured side by side
(boto3, as shardkit's s3:// source uses it, vs obstore's ranged gets), in one run.

Each contender runs in a process of its own (peak RSS is its own); requests and bytes sent
are counted with botocore's event hooks in that process. Medians of --repeats runs,
interleaved.

    .venv/bin/python scripts/bench/objects.py --size 200MB --repeats 3
    (obstore, where installed: the bench venv; its column is left out otherwise)

``--build-workers N`` adds ``shardkit build`` through the CLI (a process of its own, from a
folder of one file per sample) with N workers, to a local directory and to ``s3://``,
interleaved; its time is the build's own (``--json``: interpreter start left out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

BUCKET = "bench"
CONTENDERS = ("local", "shardkit-s3", "wds+upload", "ray-s3", "raw-s3")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(total: int, size: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(0)
    blob = rng.integers(0, 255, size=size * 16, dtype=np.uint8).tobytes()
    for i in range(total // size):
        off = (i * 7919) % (len(blob) - size)
        yield {"__key__": f"s{i:07d}", "bin": blob[off : off + size], "json": {"i": i}}


def _count(client: Any, stats: dict[str, int]) -> None:
    def before_send(request: Any, **_: Any) -> None:
        stats["requests"] += 1
        body = request.body
        if body is not None and hasattr(body, "__len__"):
            stats["bytes_sent"] += len(body)
        elif body is not None and hasattr(body, "seek"):
            pos = body.tell()
            body.seek(0, 2)
            stats["bytes_sent"] += body.tell() - pos
            body.seek(pos)

    client.meta.events.register("before-send.s3", before_send)


def _peak_rss() -> int:
    """This process's peak RSS (VmHWM: getrusage's ru_maxrss keeps the parent's across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(
    kind: str, endpoint: str, size: int, sample: int, shard: str, run: int
) -> dict[str, Any]:
    """One contender, in this (child) process."""
    import boto3

    import shardkit as sk

    stats = {"requests": 0, "bytes_sent": 0}
    samples = list(_samples(size, sample))
    t0 = time.perf_counter()
    if kind == "local":
        with tempfile.TemporaryDirectory() as d, sk.ShardWriter(d, maxsize=shard) as w:
            for s in samples:
                w.write(s)
    elif kind == "shardkit-s3":
        import shardkit.io.store_s3 as stores

        real = stores.S3Store.__init__

        def counted(self: Any, *a: Any, **kw: Any) -> None:
            real(self, *a, **kw)
            _count(self.client, stats)

        stores.S3Store.__init__ = counted  # type: ignore[method-assign]
        with sk.ShardWriter(f"s3://{BUCKET}/sk-{run}/", maxsize=shard) as w:
            for s in samples:
                w.write(s)
    elif kind == "wds+upload":
        import webdataset as wds

        client = boto3.client("s3", endpoint_url=endpoint)
        _count(client, stats)
        with tempfile.TemporaryDirectory() as d:

            def upload(path: str) -> None:
                client.upload_file(path, BUCKET, f"wds-{run}/{os.path.basename(path)}")
                os.unlink(path)  # what a user with a small disk does

            maxsize = sk.units.parse_size(shard)
            with wds.ShardWriter(f"{d}/data-%06d.tar", maxsize=maxsize, post=upload) as w:
                for s in samples:
                    w.write(s)
    elif kind == "ray-s3":
        # Ray Data's own WebDataset writer into the bucket through pyarrow's S3 filesystem, as
        # its documentation shows; its requests go through pyarrow's C++ client (not counted:
        # -1) and its peak RSS is the driver's only (Ray's workers are processes of their own)
        import pyarrow.fs as pafs
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            access_key="bench",
            secret_key="bench",
            region="us-east-1",
            scheme="http",
        )
        rows = max(1, sk.units.parse_size(shard) // sample)
        items = [{"__key__": s["__key__"], "bin": s["bin"], "json": s["json"]} for s in samples]
        t0 = time.perf_counter()  # Ray's start-up is not the write
        ray.data.from_items(items).write_webdataset(
            f"{BUCKET}/ray-{run}", filesystem=fs, min_rows_per_file=rows
        )
        stats = {"requests": -1, "bytes_sent": -1}
        ray.shutdown()
    elif kind == "raw-s3":
        from shardkit.io.store_s3 import S3Store

        store = S3Store(BUCKET, endpoint_url=endpoint, part_size=8 << 20)
        _count(store.client, stats)
        up = store.upload(f"raw-{run}/all.bin")
        for s in samples:
            up.write(s["bin"])
        up.complete()
    else:
        raise SystemExit(f"unknown contender {kind}")
    secs = time.perf_counter() - t0
    peak = _peak_rss()
    return {"kind": kind, "secs": secs, "samples": len(samples), "peak_rss": peak, **stats}


def build_cli(endpoint: str, size: int, sample: int, shard: str, workers: int,
              repeats: int) -> list[dict[str, Any]]:  # fmt: skip
    """``shardkit build DIR -o OUT --workers N`` to local disk and to s3, interleaved."""
    rows = []
    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as outs:
        for s in _samples(size, sample):
            with open(os.path.join(src, f"{s['__key__']}.bin"), "wb") as f:
                f.write(s["bin"])
        for rep in range(repeats):
            for kind in ("build local", "build s3"):
                out = (os.path.join(outs, f"b{rep}") if kind == "build local"
                       else f"s3://{BUCKET}/build-{rep}/")  # fmt: skip
                cmd = [sys.executable, "-m", "shardkit", "build", src, "-o", out, "--workers",
                       str(workers), "--maxsize", shard, "--json", "--no-progress"]  # fmt: skip
                env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
                res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                d = json.loads(res.stdout)
                rows.append({"kind": kind, "secs": d["seconds"], "samples": d["samples"],
                             "bytes": d["bytes"], "rep": rep})  # fmt: skip
    return rows


def read_clients(endpoint: str, mb: int, repeats: int) -> list[dict[str, Any]]:
    """Ranged reads of one object in 8 MiB ranges: boto3 (shardkit's s3 source) vs obstore."""
    import boto3

    from shardkit.cache import opener_for
    from shardkit.io import IoConfig

    client = boto3.client("s3", endpoint_url=endpoint)
    data = os.urandom(mb << 20)
    client.put_object(Bucket=BUCKET, Key="read/obj.bin", Body=data)
    rows = []
    for rep in range(repeats):
        opener = opener_for(IoConfig(endpoint_url=endpoint))
        t0 = time.perf_counter()
        got = opener.read(f"s3://{BUCKET}/read/obj.bin")
        rows.append({"client": "shardkit s3 (boto3)", "secs": time.perf_counter() - t0,
                     "ok": got == data, "rep": rep})  # fmt: skip
        try:
            import obstore
            from obstore.store import S3Store as ObS3
        except ImportError:
            continue
        store = ObS3(BUCKET, endpoint=endpoint, access_key_id="bench",
                     secret_access_key="bench", region="us-east-1",
                     client_options={"allow_http": True})  # fmt: skip
        t0 = time.perf_counter()
        step = 8 << 20
        parts = [
            bytes(obstore.get_range(store, "read/obj.bin", start=o, end=min(o + step, len(data))))
            for o in range(0, len(data), step)
        ]
        rows.append({"client": "obstore", "secs": time.perf_counter() - t0,
                     "ok": b"".join(parts) == data, "rep": rep})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="200MB", help="payload bytes per build")
    ap.add_argument("--sample", default="100KB", help="bytes per sample")
    ap.add_argument("--shard", default="32MB", help="shard size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--build-workers",
        type=int,
        default=0,
        help="also time `shardkit build --workers N` to local disk and to s3",
    )
    ap.add_argument("--only-build", action="store_true", help="only the --build-workers rows")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from shardkit.units import parse_size

    if args.child:
        kind, endpoint, size, sample, run = args.child
        print(json.dumps(run_one(kind, endpoint, int(size), int(sample), args.shard, int(run))))
        return
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    size, sample = parse_size(args.size), parse_size(args.sample)
    rows: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] = []
    try:
        if args.build_workers:
            builds = build_cli(endpoint, size, sample, args.shard, args.build_workers,
                               args.repeats)  # fmt: skip
        for rep in range(0 if args.only_build else args.repeats):
            for kind in CONTENDERS:
                cmd = [sys.executable, __file__, "--shard", args.shard, "--child", kind, endpoint,
                       str(size), str(sample), str(rep)]  # fmt: skip
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        reads = [] if args.only_build else read_clients(endpoint, 64, args.repeats)
    finally:
        server.stop()
    load = os.getloadavg()[0]
    for kind in ("build local", "build s3"):
        mine = [r for r in builds if r["kind"] == kind]
        if mine:
            secs = statistics.median(r["secs"] for r in mine)
            each = sorted(round(r["secs"], 2) for r in mine)
            rate, mbs = mine[0]["samples"] / secs, mine[0]["bytes"] / secs / 1e6
            print(f"shardkit {kind} --workers {args.build_workers}: {rate:.0f} samples/s, "
                  f"{mbs:.1f} MB/s (median of {len(mine)}: {each} s)")  # fmt: skip
    if not rows:
        print(f"load {load:.1f}")
        return
    print(f"payload {args.size} in {args.sample} samples, {args.shard} shards, "
          f"medians of {args.repeats}, load {load:.1f}")  # fmt: skip
    print(f"{'contender':<14} {'samples/s':>10} {'MB/s':>8} {'x raw':>6} {'requests':>9} "
          f"{'MB sent':>8} {'peak RSS MB':>12}")  # fmt: skip
    raw = statistics.median(r["secs"] for r in rows if r["kind"] == "raw-s3")
    for kind in CONTENDERS:
        mine = [r for r in rows if r["kind"] == kind]
        secs = statistics.median(r["secs"] for r in mine)
        n = mine[0]["samples"]
        reqs = statistics.median(r["requests"] for r in mine)
        sent = statistics.median(r["bytes_sent"] for r in mine) / 1e6
        print(f"{kind:<14} {n / secs:>10.0f} {size / secs / 1e6:>8.1f} {raw / secs:>6.2f} "
              f"{f'{reqs:.0f}' if reqs >= 0 else 'n/a':>9} "
              f"{f'{sent:.1f}' if sent >= 0 else 'n/a':>8} "
              f"{statistics.median(r['peak_rss'] for r in mine) / 1e6:>12.0f}")  # fmt: skip
    for client in sorted({r["client"] for r in reads}):
        mine = [r for r in reads if r["client"] == client]
        secs = statistics.median(r["secs"] for r in mine)
        ok = all(r["ok"] for r in mine)
        print(f"read 64 MB in 8 MiB ranges, {client}: {64 / secs:.0f} MB/s (bytes right: {ok})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"builds": rows, "cli": builds, "reads": reads, "load": load}, f, indent=1)


if __name__ == "__main__":
    main()
