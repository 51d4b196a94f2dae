"""Random access benchmark: sample i by index, shardkit vs mosaic streaming vs litdata vs raw.

Every contender looks up the same seeded random sample numbers, one at a time, in one
process (what a map-style Dataset under a RandomSampler does per worker):

- local: ``shardkit.IndexedShards`` over the shardkit shards (a search over the shard
  starts, the sample index, one pread of the sample and its bytes checked against their
  digest in the index (version 3), its signature checked; ``verify off``: the same without
  the digest, as the peers read; ``v2 index``: the same shards with indexes as shardkit
  wrote them before per-sample digests, so the pieces holding the sample are read whole and
  checked, as every lookup was checked before), mosaic
  ``StreamingDataset(local=...)[i]`` over MDS shards, litdata ``StreamingDataset(dir)[i]``
  over its chunks, each written from the same samples; the raw limit is ``os.pread`` of the
  sample's bytes (offsets from shardkit's index, opened files kept: no parse, no check).
- remote (shardkit only): the same lookups over HTTP (the tests' RangeServer with
  ``--latency`` per request) through the node cache (an empty cache every repetition: the
  first lookups in a shard fetch and verify the pieces they need, the shard then fills)
  and without a cache (each lookup a ranged read of the ``--piece-size`` pieces holding
  its sample, each checked). mosaic and litdata read no http(s) remote (object stores
  only: s3, gs, azure, ...), so they have no http row.
- s3 (``--moto-python PY``: a Python with ``moto[server]``, e.g. the project's ``.venv``):
  the three formats uploaded to a local moto S3 server, each library reading its own with
  an empty local cache every repetition (``--remote-lookups`` lookups): shardkit through
  the node cache (pieces the lookup needs first, the shard filled behind), mosaic
  (``remote=s3://..., local=...``: a whole shard downloaded on its first lookup), litdata
  (whole chunks). moto answers every request in Python: its per-request cost weighs on
  the library that sends the most requests. shardkit's time includes waiting for the
  shard fills it started to end (``close()``), as mosaic's includes its downloads.

Prints lookups/s medians and the share of the raw limit; writes the JSON to ``--out``.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from typing import Any

import _common
import _peers
from _common import Dataset, base_parser, describe, finish, fmt, fresh_dir, log, table

from shardkit.units import parse_size


def write_shardkit(ds: Dataset, out: str, shard_bytes: int, piece_size: int) -> None:
    import shardkit

    with shardkit.ShardWriter(out, maxsize=shard_bytes, piece_size=piece_size) as w:
        for s in ds.samples:
            w.write(s)


def older_indexes(root: str, out: str) -> str:
    """A copy of the shardkit set at ``root`` (its shards linked) with version 2 sample
    indexes, as shardkit wrote them before per-sample digests; its manifest's path."""
    import hashlib
    import json

    from shardkit.format.tario.index import parse_index, write_index

    with open(os.path.join(root, "manifest.json")) as f:
        doc = json.load(f)
    for e in doc["shards"]:
        os.link(os.path.join(root, e["url"]), os.path.join(out, e["url"]))
        with open(os.path.join(root, e["index"]), "rb") as f:
            idx = parse_index(f.read())
        assert idx.signatures is not None
        offsets, sigs = idx.offsets.tolist(), idx.signatures.tolist()
        data = write_index(offsets[:-1], offsets[-1], signatures=sigs, shard_checksum=e["checksum"])
        os.makedirs(os.path.dirname(os.path.join(out, e["index"])), exist_ok=True)
        with open(os.path.join(out, e["index"]), "wb") as f:
            f.write(data)
        e["index_checksum"] = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(doc, f)
    return os.path.join(out, "manifest.json")


def raw_lookup(root: str) -> Any:
    """``pread`` of each sample's bytes, from shardkit's index (the floor under any reader)."""
    import numpy as np

    from shardkit.format.manifest.model import Manifest
    from shardkit.format.tario.index import read_index

    m = Manifest.load(os.path.join(root, "manifest.json"))
    fds, offsets, starts = [], [], [0]
    for e in m.shards:
        path = os.path.join(root, e.url)
        fds.append(os.open(path, os.O_RDONLY))
        with open(os.path.join(root, e.index or ""), "rb") as f:
            offsets.append(read_index(f.read()))
        starts.append(starts[-1] + e.nsamples)
    starts_arr = np.array(starts)

    def get(i: int) -> bytes:
        s = int(np.searchsorted(starts_arr, i, side="right")) - 1
        lo, hi = offsets[s][i - starts[s]], offsets[s][i - starts[s] + 1]
        return os.pread(fds[s], int(hi - lo), int(lo))

    return get


def lookups(get: Any, ids: list[int]) -> dict[str, Any]:
    for i in ids:
        get(i)
    return {}


def contenders_local(root: str, ids: list[int]) -> list[tuple[str, Any]]:
    import shardkit

    mosaic = _peers.streaming()
    from litdata import StreamingDataset as LitDataset

    from shardkit.io.config import IoConfig, ReaderLimits

    manifest = os.path.join(root, "shardkit", "manifest.json")
    sk_ds = shardkit.IndexedShards(manifest)
    sk_off = shardkit.IndexedShards(manifest, io=IoConfig(limits=ReaderLimits(verify="off")))
    v2 = older_indexes(os.path.join(root, "shardkit"), fresh_dir(os.path.join(root, "v2")))
    sk_v2 = shardkit.IndexedShards(v2)
    mds = mosaic.StreamingDataset(local=os.path.join(root, "mosaic"), shuffle=False, batch_size=1)
    lit = LitDataset(os.path.join(root, "litdata"))
    raw = raw_lookup(os.path.join(root, "shardkit"))
    gets = (sk_ds.__getitem__, sk_off.__getitem__, sk_v2.__getitem__, mds.__getitem__)
    for get in (*gets, lit.__getitem__, raw):
        get(ids[0])  # open what each opens once (files, indexes), outside the timing
    return [
        ("raw pread", lambda: lookups(raw, ids)),
        ("shardkit IndexedShards", lambda: lookups(sk_ds.__getitem__, ids)),
        ("shardkit IndexedShards, verify off", lambda: lookups(sk_off.__getitem__, ids)),
        ("shardkit IndexedShards, v2 index", lambda: lookups(sk_v2.__getitem__, ids)),
        ("mosaic StreamingDataset", lambda: lookups(mds.__getitem__, ids)),
        ("litdata StreamingDataset", lambda: lookups(lit.__getitem__, ids)),
    ]


def contenders_remote(url: str, ids: list[int], few: list[int]) -> list[tuple[str, Any]]:
    import shardkit

    def cached() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as cache:
            ds = shardkit.IndexedShards(url, cache_dir=cache)
            lookups(ds.__getitem__, ids)
            ds.close()  # the fills it started, before the cache dir goes
            return {}

    def uncached() -> dict[str, Any]:
        return lookups(shardkit.IndexedShards(url).__getitem__, few)

    return [("shardkit http, node cache", cached), ("shardkit http, no cache", uncached)]


class Moto:
    """moto's S3 server in a process of its own (``python -m moto.server``)."""

    def __init__(self, python: str) -> None:
        import socket
        import subprocess
        import time

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        until = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > until:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)  # polling a port that is not open yet
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
            "S3_ENDPOINT_URL": self.url,  # mosaic's name for it
        }.items():
            os.environ[name] = value

    def upload(self, root: str, bucket: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.url)
        client.create_bucket(Bucket=bucket)
        for fmt_dir in ("shardkit", "mosaic", "litdata"):
            for dirpath, _, files in os.walk(os.path.join(root, fmt_dir)):
                for f in files:
                    path = os.path.join(dirpath, f)
                    client.upload_file(path, bucket, os.path.relpath(path, root))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def contenders_s3(bucket: str, ids: list[int]) -> list[tuple[str, Any]]:
    import shardkit

    mosaic = _peers.streaming()
    from litdata import StreamingDataset as LitDataset

    def fresh(make: Any) -> Any:
        def run() -> dict[str, Any]:
            with tempfile.TemporaryDirectory() as cache:
                ds = make(cache)
                lookups(ds.__getitem__, ids)
                if isinstance(ds, shardkit.IndexedShards):
                    ds.close()  # the fills it started, before the cache dir goes
                return {}

        return run

    return [
        (
            "shardkit s3, node cache",
            fresh(
                lambda d: shardkit.IndexedShards(
                    f"s3://{bucket}/shardkit/manifest.json", cache_dir=d
                )
            ),
        ),
        (
            "mosaic s3",
            fresh(
                lambda d: mosaic.StreamingDataset(
                    remote=f"s3://{bucket}/mosaic", local=d, shuffle=False, batch_size=1
                )
            ),
        ),
        ("litdata s3", fresh(lambda d: LitDataset(f"s3://{bucket}/litdata", cache_dir=d))),
    ]


def part_s3(root: str, profile: str, ids: list[int], args: Any) -> tuple[str, Any]:
    moto = Moto(args.moto_python)
    try:
        bucket = f"bench-{profile}"
        moto.upload(root, bucket)
        s3 = contenders_s3(bucket, ids)
        series = _common.interleave(args.repeats, s3, before=_common.before_runs(False))
        return report(series, {name: len(ids) for name, _ in s3})
    finally:
        moto.close()


def report(series: dict[str, Any], counts: dict[str, int]) -> tuple[str, list[dict[str, Any]]]:
    raw = series.get("raw pread")
    raw_rate = counts["raw pread"] / raw.median if raw else None
    rows, recs = [], []
    for name, s in series.items():
        rate = counts[name] / s.median
        pct = rate / raw_rate * 100 if raw_rate else None
        recs.append({"name": name, "lookups": counts[name], "seconds": s.seconds, "rate": rate})
        rows.append([name, str(counts[name]), fmt(s.median, ".3f"), fmt(rate), fmt(pct, ".1f")])
    return table(["contender", "lookups", "median s", "lookups/s", "% of raw"], rows), recs


def run_profile(profile: str, args: Any) -> tuple[list[str], dict[str, Any]]:
    ds = _common.make_dataset(profile, args.size_bytes)
    root = os.path.join(args.work, f"random-{profile}")
    log(f"random access: {describe(ds)}; writing it in every format")
    write_shardkit(ds, fresh_dir(os.path.join(root, "shardkit")), args.shard_bytes, args.piece)
    _peers.write_mds(ds, fresh_dir(os.path.join(root, "mosaic")), args.shard_bytes)
    _peers.write_litdata(ds, fresh_dir(os.path.join(root, "litdata")), args.shard_bytes)
    rng = random.Random(17)
    ids = [rng.randrange(len(ds.samples)) for _ in range(args.lookups)]
    before = _common.before_runs(False)
    texts, out = [], {"samples": len(ds.samples), "payload_bytes": ds.payload_bytes}
    if "local" in args.part_list:
        local = contenders_local(root, ids)
        series = _common.interleave(args.repeats, local, before=before)
        text, out["local"] = report(series, {name: len(ids) for name, _ in local})
        texts.append(f"### random access, local, {describe(ds)}\n\n{text}\n")
    if "http" in args.part_list:
        from remote import Server

        server = Server(os.path.join(root, "shardkit"), args.latency, 1e9, 0)
        try:
            few = ids[: args.uncached_lookups]
            remote = contenders_remote(server.url("manifest.json"), ids, few)
            series = _common.interleave(args.repeats, remote, before=before)
            counts = {remote[0][0]: len(ids), remote[1][0]: len(few)}
            text, out["remote"] = report(series, counts)
        finally:
            server.close()
        texts.append(
            f"### random access, http with {args.latency * 1000:.0f} ms per request, "
            f"{describe(ds)}, pieces of {args.piece_size}\n\n{text}\n"
        )
    if args.moto_python and "s3" in args.part_list:
        text_s3, out["s3"] = part_s3(root, profile, ids[: args.remote_lookups], args)
        texts.append(f"### random access, s3 (moto), {describe(ds)}\n\n{text_s3}\n")
    return texts, out


def main() -> None:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--lookups", type=int, default=2000, help="random lookups per contender")
    p.add_argument("--uncached-lookups", type=int, default=200)
    p.add_argument("--latency", type=float, default=0.005, help="seconds per http request")
    p.add_argument("--piece-size", default="1MB", help="shardkit's piece checksums")
    p.add_argument("--moto-python", default=None, help="a python with moto[server]: s3 part")
    p.add_argument("--remote-lookups", type=int, default=200, help="lookups of the s3 part")
    p.add_argument("--parts", default="local,http,s3", help="comma list: local,http,s3")
    args = p.parse_args()
    args.part_list = [x.strip() for x in args.parts.split(",") if x.strip()]
    _common.parse_common(args)
    args.piece = parse_size(args.piece_size)
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    results["lookups"] = args.lookups
    texts: list[str] = []
    for profile in args.profile_list:
        t, results["profiles"][profile] = run_profile(profile, args)
        texts += t
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    note = f"medians of {args.repeats}; warm page cache; load average at the end {load}"
    finish(args.out, "random_access", results, texts, note)


if __name__ == "__main__":
    sys.exit(main())
