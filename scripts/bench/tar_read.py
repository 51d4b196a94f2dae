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

Verified reads (issue 30): ``shardkit.ShardDataset`` over the shards' manifest, verified
(the default: the manifest vouches for each sample's digest through its version 3 sample
index, so each sample is hashed in place as the tar reader reads it and handed out once it
matches), verified by pieces (the same shards, their manifest without ``index_checksum``:
each 16 MiB piece read into a reused buffer and checked before any of it is handed out,
then copied out by the tar reader; what a set written before index version 3 gets) and
with ``verify="off"``; the floor of a verified read that hashes as it reads ("each read
hashed": the tar reader over a stream that hashes every read once, no checks); and "hold"
(``--hold-pieces``: piece sizes to try; none by default), a way tried and not built: each
sample held until the piece holding its last byte is whole and hashed. Its cost is the
memory a piece of held samples takes: past the CPU's L2 every byte is copied into cold
memory, which the allocator also trims and faults in again.

    .venv/bin/python scripts/bench/tar_read.py --size 200MB --repeats 5

Run it with ``PYTHONPATH`` pointing at another checkout to time that checkout's reader on
the same data (the data is written by the shardkit that runs the script).
"""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import statistics
import sys
import tarfile
from collections.abc import Callable
from typing import Any

import xxhash
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
from shardkit.format.tario.reader import TarReader
from shardkit.io.config import IoConfig, ReaderLimits
from shardkit.units import parse_size


def _write_shardkit(ds: Any, out: str, shard_size: int) -> list[str]:
    with shardkit.ShardWriter(fresh_dir(out), maxsize=shard_size) as w:
        for s in ds.samples:
            w.write(s)
    return sorted(glob.glob(os.path.join(out, "*.tar")))


def _without_index_checksums(manifest: str) -> str:
    """A copy of ``manifest`` beside it whose shards' indexes are not vouched for (no
    ``index_checksum``): its verified reads check pieces, as before index version 3."""
    with open(manifest) as f:
        doc = json.load(f)
    for entry in doc["shards"]:
        entry.pop("index_checksum", None)
    out = os.path.join(os.path.dirname(manifest), "manifest-pieces.json")
    with open(out, "w") as f:
        json.dump(doc, f)
    return out


def _read_dataset(manifest: str, verify: str) -> Callable[[], dict[str, int]]:
    def run() -> dict[str, int]:
        ds = shardkit.ShardDataset(manifest, io=IoConfig(limits=ReaderLimits(verify=verify)))
        return {"samples": sum(1 for _ in ds)}

    return run


class _Hashed(io.RawIOBase):
    """A file read as it is (each read into its own ``bytes``), every byte hashed once per
    piece as it first passes; ``verified_to`` is the end of the last whole piece (the "hold"
    way). It seeks, as the tar reader's unbuffered reads of large members want."""

    def __init__(self, path: str, piece: int) -> None:
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        self._piece = piece
        self._pos = 0
        self._hashed = 0
        self._h = xxhash.xxh3_128()
        self.verified_to = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._f.seek(offset, whence)
        return self._pos

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        data = self._f.read(size)
        view, at = memoryview(data), self._hashed - self._pos
        self._pos += len(data)
        while at < len(data):
            take = min(len(data) - at, self._piece - self._hashed % self._piece)
            self._h.update(view[at : at + take])
            at += take
            self._hashed += take
            if self._hashed % self._piece == 0:
                self._h.hexdigest()  # the check against the manifest's digest
                self._h = xxhash.xxh3_128()
                self.verified_to = self._hashed
        return data

    def close(self) -> None:
        self._f.close()
        super().close()


def _read_held(paths: list[str], piece: int) -> Callable[[], dict[str, int]]:
    def run() -> dict[str, int]:
        n = 0
        for p in paths:
            with _Hashed(p, piece) as f:
                reader = TarReader(f, url=p, size=os.path.getsize(p))  # type: ignore[arg-type]
                held: collections.deque[Any] = collections.deque()
                for _, sample in reader.samples():
                    held.append((reader.offset, sample))
                    while held and held[0][0] <= f.verified_to:
                        held.popleft()
                        n += 1
                n += len(held)  # the last piece, checked at the end
        return {"samples": n}

    return run


def _read_hashed(paths: list[str]) -> Callable[[], dict[str, int]]:
    """The tar reader over a stream that hashes every read once, in place (xxh3, no check,
    no hold): what any verified read that hashes as it reads pays over ``read_shard``,
    with no Python of its own beyond one call a read: the floor of a verified read."""

    def run() -> dict[str, int]:
        n = 0
        for p in paths:
            with _Hashed(p, 1 << 62) as f:
                reader = TarReader(f, url=p, size=os.path.getsize(p))  # type: ignore[arg-type]
                n += sum(1 for _ in reader.samples())
        return {"samples": n}

    return run


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
    p.add_argument("--hold-pieces", default="", help="piece sizes of the hold way (16MiB,1MiB)")
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
        manifest = os.path.join(work, "sk", "manifest.json")
        by_pieces = _without_index_checksums(manifest)
        held = [
            (f"hold, {size >> 20} MiB pieces (shardkit tars)", _read_held(own, size))
            for size in (parse_size(x) for x in args.hold_pieces.split(",") if x)
        ]
        contenders = [
            ("read_shard (shardkit tars)", _read_shardkit(own)),
            ("ShardDataset verified (shardkit tars)", _read_dataset(manifest, "on")),
            ("ShardDataset verified by pieces", _read_dataset(by_pieces, "on")),
            ("ShardDataset verify=off (shardkit tars)", _read_dataset(manifest, "off")),
            ("read_shard, each read hashed (floor)", _read_hashed(own)),
            *held,
            ("read_shard (tarfile pax tars)", _read_shardkit(pax)),
            ("tarfile (tarfile pax tars)", _read_tarfile(pax)),
            ("reads alone (shardkit tars)", _member_reads(own)),
            ("raw read (shardkit tars)", _read_raw(own)),
        ]
        before = "/".join(f"{x:.1f}" for x in os.getloadavg())
        series = interleave(args.repeats, contenders, before=before_runs(False))
        raw = statistics.median(series["raw read (shardkit tars)"].extra["cpu_s"])
        own_cpu = statistics.median(series["read_shard (shardkit tars)"].extra["cpu_s"])
        rows = []
        for name, s in series.items():
            cpu = statistics.median(s.extra["cpu_s"])
            row = [name, fmt(cpu, ".3f"), fmt(len(ds.samples) / cpu, ",.0f")]
            row += [fmt(100 * raw / cpu, ".0f") + "%", fmt(100 * own_cpu / cpu, ".0f") + "%"]
            rows.append(row)
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        loads = f"load average {before} before, {load} after"
        texts.append(f"### {profile}: {describe(ds)} ({loads})\n\n")
        head = ["reader", "CPU s (median)", "samples / CPU s", "% of raw", "% of read_shard"]
        texts.append(table(head, rows))
        results[profile] = {n: {"cpu_s": s.extra["cpu_s"]} for n, s in series.items()}
    finish(args.out, "tar_read", results, texts, f"shardkit from {shardkit.__file__}")


if __name__ == "__main__":
    sys.exit(main())
