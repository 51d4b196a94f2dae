"""Write benchmark: shardkit.ShardWriter vs the peers vs a raw write+checksum.

Same samples for everyone (generated once per profile, before any timing), interleaved
repetitions, medians. Contenders:

- shardkit.ShardWriter with sha256 (default) and xxh3_128: tar shards + index + manifest,
  checksummed while written, each shard fsynced before its rename.
- webdataset.ShardWriter (tar, no checksum, no fsync).
- mosaic streaming MDSWriter, without hashes (its default) and with sha256 per shard.
- litdata BinaryWriter (the writer ``litdata.optimize`` drives, used in-process so no
  worker processes are counted; no checksum).
- raw: the same payload bytes (every field already encoded) joined into 4 MB writes, hashed
  with the same algorithm and fsynced per shard: the limit a writer with shardkit's
  guarantees can reach. ``raw-nofsync`` drops the fsync (what the peers do).

MB/s is payload bytes (encoded fields) per second for every contender.

    .bench-venv/bin/python scripts/bench/write.py --size 1GB --repeats 3
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import _peers
import xxhash
from _common import (
    Dataset,
    Series,
    base_parser,
    describe,
    dir_bytes,
    fresh_dir,
    interleave,
    log,
    make_dataset,
    parse_common,
    rate_row,
    save_results,
    sync,
    table,
)

from shardkit.format.codecs import encode_field

_CHUNK = 4 << 20
_HASHERS: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}


def encoded_pieces(ds: Dataset) -> list[bytes]:
    """Every field of every sample, encoded, in order (what the raw writer writes)."""
    out = []
    cache: dict[int, bytes] = {}  # pooled payloads are encoded once
    for s in ds.samples:
        key = s["__key__"]
        for f, v in s.items():
            if f == "__key__":
                continue
            if isinstance(v, bytes):
                out.append(v)
            elif f.endswith("npy"):
                if id(v) not in cache:
                    cache[id(v)] = encode_field(key, f, v)
                out.append(cache[id(v)])
            else:
                out.append(encode_field(key, f, v))
    return out


def write_raw(pieces: list[bytes], out: str, shard_bytes: int, algo: str, fsync: bool) -> None:
    """Join pieces into 4 MB writes, hash them, fsync and close every ``shard_bytes``."""
    index = 0
    f = open(os.path.join(out, f"raw-{index:06d}"), "wb", buffering=0)  # noqa: SIM115
    h = _HASHERS[algo]()
    in_shard = 0
    batch: list[bytes] = []
    pending = 0
    for p in pieces:
        batch.append(p)
        pending += len(p)
        if pending >= _CHUNK:
            data = b"".join(batch)
            h.update(data)
            f.write(data)
            in_shard += pending
            batch, pending = [], 0
            if in_shard >= shard_bytes:
                h.hexdigest()
                if fsync:
                    os.fsync(f.fileno())
                f.close()
                index += 1
                f = open(os.path.join(out, f"raw-{index:06d}"), "wb", buffering=0)  # noqa: SIM115
                h, in_shard = _HASHERS[algo](), 0
    data = b"".join(batch)
    h.update(data)
    f.write(data)
    h.hexdigest()
    if fsync:
        os.fsync(f.fileno())
    f.close()


def contenders(
    ds: Dataset, work: str, shard: int, peers: bool = True
) -> list[tuple[str, Callable[[], Any]]]:
    pieces = encoded_pieces(ds)

    def run(name: str, fn: Callable[[str], None]) -> tuple[str, Callable[[], Any]]:
        out = os.path.join(work, name)

        def go() -> dict[str, int]:
            fn(fresh_dir(out))
            return {"disk_bytes": dir_bytes(out)}

        return name, go

    own = [
        run("shardkit sha256", lambda o: _peers.write_shardkit(ds, o, shard, "sha256")),
        run("shardkit xxh3_128", lambda o: _peers.write_shardkit(ds, o, shard, "xxh3_128")),
    ]
    others = [
        run("webdataset", lambda o: _peers.write_wds(ds, o, shard)),
        run("mosaic MDS", lambda o: _peers.write_mds(ds, o, shard)),
        run("mosaic MDS sha256", lambda o: _peers.write_mds(ds, o, shard, ["sha256"])),
        run("litdata", lambda o: _peers.write_litdata(ds, o, shard)),
    ]
    raw = [
        run("raw sha256+fsync", lambda o: write_raw(pieces, o, shard, "sha256", True)),
        run("raw xxh3_128+fsync", lambda o: write_raw(pieces, o, shard, "xxh3_128", True)),
        run("raw sha256 nofsync", lambda o: write_raw(pieces, o, shard, "sha256", False)),
    ]
    return own + (others if peers else []) + raw


_RAW_FOR = {"shardkit sha256": "raw sha256+fsync", "shardkit xxh3_128": "raw xxh3_128+fsync"}


def report(ds: Dataset, series: dict[str, Series]) -> tuple[str, list[dict[str, Any]]]:
    n, payload = len(ds.samples), ds.payload_bytes
    wds = series["webdataset"].median if "webdataset" in series else float("nan")
    rows, records = [], []
    for name, s in series.items():
        raw = _RAW_FOR.get(name)
        rec, row = rate_row(s, n, payload, wds, series[raw].median if raw else None)
        records.append(rec)
        rows.append(row)
    head = ["writer", "median s", "samples/s", "MB/s", "disk/payload", "vs wds", "% raw"]
    return table(head, rows), records


def main() -> None:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--no-peers", action="store_true", help="shardkit and the raw limits only")
    args = p.parse_args()
    parse_common(args)
    if not args.no_peers:
        _peers.streaming()  # import the peers now: their import time is not write time
        import litdata.streaming.writer  # noqa: F401
        import webdataset  # noqa: F401

    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    texts = []
    for profile in args.profile_list:
        ds = make_dataset(profile, args.size_bytes)
        log(f"write: {describe(ds)}, shards of {args.shard_size}")
        work = os.path.join(args.work, "write", profile)
        runs = contenders(ds, work, args.shard_bytes, peers=not args.no_peers)
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        series = interleave(args.repeats, runs, before=sync)
        load += " before, " + "/".join(f"{x:.1f}" for x in os.getloadavg()) + " after"
        text, records = report(ds, series)
        texts.append(f"### write, {describe(ds)} (load average {load})\n\n{text}\n")
        results["profiles"][profile] = {
            "samples": len(ds.samples),
            "payload_bytes": ds.payload_bytes,
            "contenders": records,
        }
        fresh_dir(work)
    path = save_results(args.out, "write", results)
    print("\n".join(texts))
    print(f"(medians of {args.repeats}; page-cache writes, fsync where noted; JSON: {path})")


if __name__ == "__main__":
    main()
