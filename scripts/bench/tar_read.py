"""Tar reader benchmark: ``shardkit.read_shard`` on its own shards and on tarfile-written ones.

Measures the hot path of every read (the tar reader, no decode, no verification): samples
from shardkit-written shards (plain ustar headers) and from the same samples as Python's
tarfile writes them with a float mtime (a pax header before every member, as
``webdataset.ShardWriter`` does), beside the peer that reads tars for webdataset (Python's
``tarfile``, member by member, every member's bytes read) and the raw limit (the files read
in 1 MiB pieces). Between them, the floor of any reader that hands each member out as its
own ``bytes`` (what ``read_shard`` does): its reads alone, no parsing, the reader's read
pattern (a member of 64 KiB or more read into its own object, the run up to it in one
read), on offsets found before the clock starts. CPU seconds, medians of interleaved
repetitions; warm page cache.

    .venv/bin/python scripts/bench/tar_read.py --size 200MB --repeats 5

Run it with ``PYTHONPATH`` pointing at another checkout to time that checkout's reader on
the same data (the data is written by the shardkit that runs the script).
"""

from __future__ import annotations

import glob
import io
import os
import statistics
import sys
import tarfile
from collections.abc import Callable
from typing import Any

from _common import (
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
    settle,
    table,
)

import shardkit
from shardkit.format.codecs import encode_field
from shardkit.units import parse_size


def _write_shardkit(ds: Any, out: str, shard_size: int) -> list[str]:
    with shardkit.ShardWriter(fresh_dir(out), maxsize=shard_size) as w:
        for s in ds.samples:
            w.write(s)
    return sorted(glob.glob(os.path.join(out, "*.tar")))


def _write_tarfile(ds: Any, out: str, shard_size: int) -> list[str]:
    fresh_dir(out)
    paths: list[str] = []
    tf: tarfile.TarFile | None = None
    for s in ds.samples:
        if tf is None or (tf.fileobj is not None and tf.fileobj.tell() > shard_size):
            if tf is not None:
                tf.close()
            paths.append(os.path.join(out, f"wds-{len(paths):06d}.tar"))
            tf = tarfile.open(paths[-1], "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 - closed below
        for field, value in s.items():
            if field == "__key__":
                continue
            data = encode_field(s["__key__"], field, value)
            info = tarfile.TarInfo(f"{s['__key__']}.{field}")
            info.size, info.mtime = len(data), 1_700_000_000.5  # float: a pax header each
            tf.addfile(info, io.BytesIO(data))
    if tf is not None:
        tf.close()
    return paths


def _read_shardkit(paths: list[str]) -> Callable[[], dict[str, int]]:
    def run() -> dict[str, int]:
        return {"samples": sum(1 for p in paths for _ in shardkit.read_shard(p))}

    return run


def _read_tarfile(paths: list[str]) -> Callable[[], dict[str, int]]:
    def run() -> dict[str, int]:
        n = 0
        for p in paths:
            with tarfile.open(p) as tf:
                for m in tf:
                    f = tf.extractfile(m)
                    if f is not None:
                        f.read()
                        n += 1
        return {"members": n}

    return run


def _read_raw(paths: list[str]) -> Callable[[], dict[str, int]]:
    def run() -> dict[str, int]:
        total = 0
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
        return {"bytes": total}

    return run


def _member_reads(paths: list[str]) -> Callable[[], dict[str, int]]:
    """The reads ``read_shard`` makes on these shards, without the parsing (its floor)."""
    large = 1 << 16  # the reader's _UNBUFFERED: smaller members come in the buffered runs
    plan = []
    for p in paths:
        with tarfile.open(p) as tf:
            plan.append((p, [(m.offset_data, m.size) for m in tf if m.size >= large]))

    def run() -> dict[str, int]:
        total = 0
        for p, members in plan:
            with open(p, "rb", buffering=0) as f:
                pos = 0
                for at, size in members:
                    total += len(f.read(at - pos)) + len(f.read(size))
                    pos = at + size
                while chunk := f.read(1 << 19):
                    total += len(chunk)
        return {"bytes": total}

    return run


def main() -> None:
    p = base_parser(__doc__ or "")
    p.set_defaults(size="200MB", repeats=5, shard_size="64MB")
    args = p.parse_args()
    parse_common(args)
    texts: list[str] = []
    results: dict[str, Any] = {"shardkit": shardkit.__file__}
    for profile in args.profiles.split(","):
        ds = make_dataset(profile, parse_size(args.size))
        log(describe(ds))
        work = os.path.join(args.work, f"tar_read-{profile}")
        own = _write_shardkit(ds, os.path.join(work, "sk"), parse_size(args.shard_size))
        pax = _write_tarfile(ds, os.path.join(work, "pax"), parse_size(args.shard_size))
        settle(own + pax)
        contenders = [
            ("read_shard (shardkit tars)", _read_shardkit(own)),
            ("read_shard (tarfile pax tars)", _read_shardkit(pax)),
            ("tarfile (tarfile pax tars)", _read_tarfile(pax)),
            ("reads alone (shardkit tars)", _member_reads(own)),
            ("raw read (shardkit tars)", _read_raw(own)),
        ]
        series = interleave(args.repeats, contenders, before=before_runs(False))
        raw = statistics.median(series["raw read (shardkit tars)"].extra["cpu_s"])
        rows = []
        for name, s in series.items():
            cpu = statistics.median(s.extra["cpu_s"])
            row = [name, fmt(cpu, ".3f"), fmt(len(ds.samples) / cpu, ",.0f")]
            rows.append([*row, fmt(100 * raw / cpu, ".0f") + "%"])
        texts.append(f"### {profile}: {describe(ds)} (load average {os.getloadavg()[0]:.1f})\n\n")
        texts.append(table(["reader", "CPU s (median)", "samples / CPU s", "% of raw"], rows))
        results[profile] = {n: {"cpu_s": s.extra["cpu_s"]} for n, s in series.items()}
    finish(args.out, "tar_read", results, texts, f"shardkit from {shardkit.__file__}")


if __name__ == "__main__":
    sys.exit(main())
