"""Read benchmark: shardkit vs webdataset, mosaic streaming, litdata and a raw read.

1. one process, raw samples (no decode), all reading the same shardkit-written tar shards:
   shardkit.read_shard, shardkit.ShardDataset, webdataset.WebDataset, webdataset's bare
   tarfile_to_samples pipeline, and a plain sequential read of the files (the limit).
1b. ("foreign") the same, on the same samples as ``webdataset.ShardWriter`` wrote them
   (Python's tarfile: a pax header before every member), the shards most data sets have.
1c. ("gzip") the shardkit shards gzipped whole (.tar.gz), beside a plain gunzip (the limit).
2. a loader with 2 workers and batches of 32, decoded samples, each library in its own
   format written from the same samples: shardkit.WebLoader, webdataset.WebLoader, mosaic
   StreamingDataset + torch DataLoader, litdata StreamingDataset + StreamingDataLoader,
   Megatron-Energon (the shardkit shards, prepared with ``energon prepare``), Grain's
   DataLoader (ArrayRecord files), SPDL's PipelineBuilder and torchdata.nodes (the
   shardkit shards, each with its own tar parser); and "shardkit 0 workers", the same
   pipeline in the training process, the base that 2 workers are measured against.
   Each run is a fresh process (no shared memory or worker left over from the last) that
   iterates ``--epochs`` epochs (default 3): samples/s is the median epoch after the first
   (steady state), with the first epoch (worker start included) and the first batch beside
   it. One epoch per process measured mostly the start on medium samples (150 MB is 1,000
   samples, 31 batches), which is why another harness running several epochs disagreed.
3. peak RSS of a reader process as the data set grows 10x (small profile).
4. resume cost at several positions of one big shard (default 1 GB): a fresh process,
   load_state_dict, first batch; webdataset, which cannot resume, re-reads up to there.

All reads are warm page-cache reads (the data was just written and the machine has RAM
to spare), unless ``--cold`` drops the page cache (root only) before every timed run. Every
file is first settled into the page cache as a read from disk leaves it (``_common.settle``:
a file that Python's tarfile wrote in small pieces otherwise sits in small pages that cost
~3x more to read, raw read included); ``--as-written`` keeps the state the writers left.
In-process parts time wall and CPU seconds; their rates and ratios are per CPU second
(the goal is per-process speed; the machine is shared).

    .bench-venv/bin/python scripts/bench/read.py --size 1GB --repeats 3
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable
from typing import Any

import _peers
import _readers
from _common import (
    Dataset,
    base_parser,
    before_runs,
    describe,
    finish,
    fmt,
    interleave,
    log,
    make_dataset,
    parse_common,
    reads_note,
    run_script,
    settle,
    table,
)

from shardkit.units import parse_size

LOADER_IMPLS = (
    "shardkit",
    "webdataset",
    "mosaic",
    "litdata",
    "energon",
    "grain",
    "spdl",
    "torchdata.nodes",
)


def has_streaming_api() -> bool:
    import shardkit

    return hasattr(shardkit, "ShardDataset") and hasattr(shardkit, "WebLoader")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; return its JSON answer."""
    return run_script(__file__, "--child", spec)


class Formats:
    """One profile's data written once in every format."""

    def __init__(
        self, ds: Dataset, work: str, shard_bytes: int, *, peers: bool, settled: bool
    ) -> None:
        self.root = os.path.join(work, "read", ds.profile)
        self.sk = os.path.join(self.root, "shardkit")
        self.wds = os.path.join(self.root, "webdataset")
        self.mds = os.path.join(self.root, "mosaic")
        self.lit = os.path.join(self.root, "litdata")
        from _common import fresh_dir

        _peers.write_shardkit(ds, fresh_dir(self.sk), shard_bytes)
        _peers.write_wds(ds, fresh_dir(self.wds), shard_bytes)
        if peers:  # mosaic and litdata (the bench venv) only for the loader part
            _peers.write_mds(ds, fresh_dir(self.mds), shard_bytes)
            _peers.write_litdata(ds, fresh_dir(self.lit), shard_bytes)
        self.manifest = os.path.join(self.sk, "manifest.json")
        self.sk_paths = sorted(glob.glob(os.path.join(self.sk, "*.tar")))
        self.energon = os.path.join(self.root, "energon")
        self.grain_paths: list[str] = []
        if peers:  # energon's .nv-meta and Grain's ArrayRecord files, outside timing
            import _peer_energon
            import _peer_grain

            _peer_energon.prepare(self.sk_paths, fresh_dir(self.energon))
            grain_dir = fresh_dir(os.path.join(self.root, "grain"))
            self.grain_paths = _peer_grain.write_array_record(ds, grain_dir, shard_bytes)
        self.wds_paths = sorted(glob.glob(os.path.join(self.wds, "*.tar")))
        self.sk_bytes = sum(os.path.getsize(p) for p in self.sk_paths)
        self.settled = settled
        if settled:
            settle(self.sk_paths + self.wds_paths + self.grain_paths)

    def gzip_paths(self) -> list[str]:
        """The shardkit shards gzipped, written on first use."""
        import gzip
        import shutil

        out = []
        for p in self.sk_paths:
            target = p + ".gz"
            if not os.path.exists(target):
                with open(p, "rb") as src, gzip.open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            out.append(target)
        if self.settled:
            settle(out)
        return out


def check_counts(series: dict[str, Any], n: int, skip: tuple[str, ...] = ()) -> None:
    """Every reader must have seen every sample, or its rate means nothing."""
    for name, s in series.items():
        if name in skip:
            continue
        got = set(s.extra.get("samples", []))
        if got != {n}:
            raise RuntimeError(f"{name} read {sorted(got)} samples, expected {n}")


def part_inprocess(ds: Dataset, fm: Formats, args: Any) -> tuple[str, list[dict[str, Any]]]:
    paths = fm.sk_paths
    contenders: list[tuple[str, Callable[[], Any]]] = [
        ("raw read", lambda: _readers.read_raw(paths)),
        ("raw readinto", lambda: _readers.read_raw_into(paths)),
        ("shardkit read_shard", lambda: _readers.read_sk_shards(paths)),
        ("webdataset WebDataset", lambda: _readers.read_wds(paths)),
        ("webdataset tarfile_to_samples", lambda: _readers.read_wds_tar(paths)),
    ]
    if has_streaming_api():
        sk_ds = ("shardkit ShardDataset", lambda: _readers.read_sk_dataset(fm.manifest))
        off = lambda: _readers.read_sk_dataset(fm.manifest, "off")  # noqa: E731
        contenders[2:2] = [sk_ds, ("shardkit ShardDataset verify=off", off)]
        for size in args.piece_size_list:  # the same samples, pieces of another size
            manifest = _write_pieces(ds, fm, args.shard_bytes, size)
            read = lambda m=manifest: _readers.read_sk_dataset(m)  # noqa: E731
            contenders.insert(3, (f"shardkit ShardDataset, {size >> 20} MiB pieces", read))
    return _inprocess(ds, contenders, fm.sk_bytes, args, "1 process, no decode")


def _write_pieces(ds: Dataset, fm: Formats, shard_bytes: int, piece_size: int) -> str:
    """The shardkit shards again with ``piece_size``-byte pieces (outside the timing); the
    manifest's path."""
    from _common import fresh_dir

    import shardkit

    out = fresh_dir(os.path.join(fm.root, f"shardkit-p{piece_size}"))
    with shardkit.ShardWriter(out, maxsize=shard_bytes, piece_size=piece_size) as w:
        for sample in ds.samples:
            w.write(sample)
    settle(sorted(glob.glob(os.path.join(out, "*.tar"))))
    return os.path.join(out, "manifest.json")


def part_foreign(ds: Dataset, fm: Formats, args: Any) -> tuple[str, list[dict[str, Any]]]:
    """The same samples as ``webdataset.ShardWriter`` wrote them: a pax header per member."""
    paths = fm.wds_paths
    contenders: list[tuple[str, Callable[[], Any]]] = [
        ("raw read", lambda: _readers.read_raw(paths)),
        ("shardkit read_shard", lambda: _readers.read_sk_shards(paths)),
        ("webdataset WebDataset", lambda: _readers.read_wds(paths)),
        ("webdataset tarfile_to_samples", lambda: _readers.read_wds_tar(paths)),
    ]
    nbytes = sum(os.path.getsize(p) for p in paths)
    return _inprocess(ds, contenders, nbytes, args, "webdataset-written shards, 1 process")


def part_gzip(ds: Dataset, fm: Formats, args: Any) -> tuple[str, list[dict[str, Any]]]:
    """The shardkit-written shards gzipped whole (level 6, as ``gzip`` does by default)."""
    paths = fm.gzip_paths()
    contenders: list[tuple[str, Callable[[], Any]]] = [
        ("raw read", lambda: _readers.read_raw(paths)),
        ("raw gunzip", lambda: _readers.read_gunzip(paths)),
        ("shardkit read_shard", lambda: _readers.read_sk_shards(paths)),
        ("webdataset WebDataset", lambda: _readers.read_wds(paths)),
    ]
    nbytes = sum(os.path.getsize(p) for p in paths)
    return _inprocess(ds, contenders, nbytes, args, ".tar.gz shards, 1 process")


def _inprocess(
    ds: Dataset,
    contenders: list[tuple[str, Callable[[], Any]]],
    nbytes: int,
    args: Any,
    title: str,
) -> tuple[str, list[dict[str, Any]]]:
    """Time in-process readers side by side; rates against webdataset and the raw read."""
    series = interleave(args.repeats, contenders, before=before_runs(args.cold))
    n = len(ds.samples)
    check_counts(series, n, skip=tuple(name for name in series if name.startswith("raw")))
    wds_cpu = _median(series["webdataset WebDataset"].extra["cpu_s"])
    raw_cpu = _median(series["raw read"].extra["cpu_s"])
    rows, records = [], []
    for name, s in series.items():
        med, cpu = s.median, _median(s.extra["cpu_s"])
        rate = None if name.startswith("raw") else n / cpu
        rec = {
            "name": name,
            "median_s": med,
            "seconds": s.seconds,
            "median_cpu_s": cpu,
            "cpu_seconds": s.extra["cpu_s"],
            "samples_per_cpu_s": rate,
            "file_mb_per_cpu_s": nbytes / cpu / 1e6,
            "x_webdataset": wds_cpu / cpu,
            "x_webdataset_wall": series["webdataset WebDataset"].median / med,
            "pct_of_raw": raw_cpu / cpu * 100,
        }
        records.append(rec)
        rows.append(
            [
                name,
                fmt(med, ".3f"),
                fmt(cpu, ".3f"),
                fmt(rate),
                fmt(nbytes / cpu / 1e6),
                fmt(wds_cpu / cpu, ".2f") + "x",
                fmt(raw_cpu / cpu * 100, ".1f") + "%",
            ]
        )
    head = [title, "median s", "CPU s", "samples/CPU s", "MB/CPU s", "vs wds", "% raw"]
    return table(head, rows), records


def loader_specs(fm: Formats, args: Any) -> list[dict[str, Any]]:
    common = {"kind": "loader", "batch": 32, "workers": args.workers, "epochs": args.epochs}
    specs = [
        {**common, "impl": "webdataset", "urls": fm.wds_paths},
        {**common, "impl": "mosaic", "dir": fm.mds},
        {**common, "impl": "litdata", "dir": fm.lit},
        # the DataLoader setting shardkit defaults to (persistent worker processes)
        {**common, "impl": "litdata persistent", "dir": fm.lit, "persistent": True},
        {**common, "impl": "energon", "dir": fm.energon},
        {**common, "impl": "grain", "paths": fm.grain_paths},
        {**common, "impl": "spdl", "urls": fm.sk_paths},
        {**common, "impl": "spdl DataLoader", "urls": fm.sk_paths},
        {**common, "impl": "torchdata.nodes", "urls": fm.sk_paths},
    ]
    if has_streaming_api():
        specs.insert(0, {**common, "impl": "shardkit", "manifest": fm.manifest})
        off = {**common, "impl": "shardkit verify=off", "manifest": fm.manifest, "verify": "off"}
        specs.insert(1, off)
        threads = {**common, "impl": "shardkit threads", "manifest": fm.manifest}
        specs.insert(2, {**threads, "worker_mode": "thread"})
        off_threads = {**threads, "impl": "shardkit threads verify=off", "verify": "off"}
        specs.insert(3, {**off_threads, "worker_mode": "thread"})
        # the loader's work in the training process: what 2 workers deliver against it
        zero = {**common, "impl": "shardkit 0 workers", "manifest": fm.manifest, "workers": 0}
        specs.insert(4, zero)
        # torch's default, the peers' (WebLoader keeps its worker processes across epochs)
        fresh = {**common, "impl": "shardkit fresh workers", "manifest": fm.manifest}
        specs.insert(1, {**fresh, "persistent": False})
    if args.loaders:
        specs = [s for s in specs if s["impl"] in args.loaders.split(",")]
    return specs


def part_loader(ds: Dataset, fm: Formats, args: Any) -> tuple[str, list[dict[str, Any]]]:
    contenders = [(s["impl"], lambda s=s: child(s)) for s in loader_specs(fm, args)]
    series = interleave(args.repeats, contenders, before=before_runs(args.cold))
    n = len(ds.samples)
    check_counts(series, n)
    wds = series.get("webdataset")
    wds_rate = n / _steady(wds.extra) if wds else None  # --loaders may leave it out
    rows, records = [], []
    for name, s in series.items():
        first = _median(s.extra["seconds"])  # a fresh loader: from the first next() on
        steady = _steady(s.extra)
        rate = n / steady
        rec = {
            "name": name,
            "iter_seconds": s.extra["seconds"],
            "epoch_seconds": s.extra["epoch_seconds"],
            "process_seconds": s.seconds,
            "samples_per_s": rate,
            "first_epoch_samples_per_s": n / first,
            "payload_mb_per_s": ds.payload_bytes / steady / 1e6,
            "first_batch_s": _median(s.extra["first_batch_s"]),
            "maxrss_mb": _median(s.extra["maxrss_mb"]),
            "x_webdataset": rate / wds_rate if wds_rate else None,
        }
        records.append(rec)
        rows.append(
            [
                name,
                fmt(first, ".2f"),
                fmt(n / first),
                fmt(rate),
                fmt(rec["payload_mb_per_s"]),
                fmt(rec["first_batch_s"], ".2f"),
                fmt(rec["maxrss_mb"]),
                fmt(rate / wds_rate, ".2f") + "x" if wds_rate else "-",
            ]
        )
    head = [f"loader, {args.workers} workers, batch 32", "epoch 1 s", "epoch 1 samples/s"]
    head += ["samples/s", "MB/s", "first batch s", "main RSS MB", "vs wds"]
    return table(head, rows), records


def _steady(extra: dict[str, Any]) -> float:
    """Seconds of an epoch in steady state: the median of the epochs after the first
    (every run's), or of the first epochs when only one was run."""
    later = [x for runs in extra["epoch_seconds"] for x in runs]
    return _median(later or extra["seconds"])


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def part_rss(ds: Dataset, fm: Formats, args: Any) -> tuple[str, list[dict[str, Any]]]:
    """Peak RSS of one reader process over a tenth of the data and over all of it."""
    from _common import Dataset as _D
    from _common import fresh_dir

    tenth = _D(ds.profile, ds.samples[: max(1, len(ds.samples) // 10)], ds.payload_bytes // 10)
    small_dir = fresh_dir(os.path.join(fm.root, "rss-tenth"))
    _peers.write_shardkit(tenth, small_dir, max(4096, args.shard_bytes // 10))
    sets = {
        "1x": (os.path.join(small_dir, "manifest.json"), _tars(small_dir), len(tenth.samples)),
        "10x": (fm.manifest, fm.sk_paths, len(ds.samples)),
    }
    impls = ["shardkit read_shard", "webdataset WebDataset"]
    if has_streaming_api():
        impls.insert(0, "shardkit ShardDataset")
    rows, records = [], []
    for impl in impls:
        rss = {}
        for label, (manifest, paths, n) in sets.items():
            spec = {"kind": "rss", "impl": impl, "manifest": manifest, "paths": paths}
            runs = [child(spec) for _ in range(args.repeats)]
            if {r["samples"] for r in runs} != {n}:
                raise RuntimeError(f"{impl} read {runs} samples of {label}, expected {n}")
            rss[label] = _median([r["maxrss_mb"] for r in runs])
        growth = rss["10x"] / rss["1x"] - 1
        records.append({"name": impl, "maxrss_mb": rss, "growth": growth})
        rows.append([impl, fmt(rss["1x"]), fmt(rss["10x"]), fmt(growth * 100, "+.1f") + "%"])
    head = ["reader (1 process)", "peak RSS MB, 1x", "peak RSS MB, 10x", "growth"]
    return table(head, rows), records


def _tars(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "*.tar")))


def part_resume(args: Any) -> tuple[str, list[dict[str, Any]]]:
    """Resume at several positions of one big shard: shardkit vs webdataset's re-read."""
    from _common import fresh_dir

    ds = make_dataset("small", args.resume_bytes, seed=1)
    root = fresh_dir(os.path.join(args.work, "read", "resume"))
    _peers.write_shardkit(ds, root, args.resume_bytes * 2)
    manifest, paths = os.path.join(root, "manifest.json"), _tars(root)
    if len(paths) != 1:
        raise RuntimeError(f"expected one shard for the resume test, got {len(paths)}")
    nbatches = len(ds.samples) // 32
    log(f"resume: one shard of {os.path.getsize(paths[0]) / 1e9:.2f} GB, {nbatches} batches")
    rows, records = [], []
    for frac in args.position_list:
        pos = min(int(frac * nbatches), nbatches - 1)
        rec: dict[str, Any] = {"fraction": frac, "batch": pos}
        for workers in args.resume_worker_list:
            state = os.path.join(root, f"state-{pos}-{workers}.json")
            spec = {"manifest": manifest, "batch": 32, "workers": workers, "state": state}
            child({**spec, "kind": "resume-save", "batches": pos})
            runs = [child({**spec, "kind": "resume-load"}) for _ in range(args.repeats)]
            rec[f"shardkit_w{workers}_s"] = _median([r["seconds"] for r in runs])
        skip = child({"kind": "skip", "urls": paths, "batch": 32, "batches": pos})
        rec["webdataset_reread_s"] = skip["seconds"]
        records.append(rec)
        cells = [fmt(rec[f"shardkit_w{w}_s"], ".3f") for w in args.resume_worker_list]
        rows.append([f"{frac:.2f}", str(pos), *cells, fmt(skip["seconds"], ".2f")])
    head = ["position", "batch"]
    head += [f"shardkit resume s ({w} workers)" for w in args.resume_worker_list]
    head += ["webdataset re-read s"]
    return table(head, rows), records


def parse_args() -> Any:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="inprocess,foreign,gzip,loader,rss,resume")
    p.add_argument("--workers", type=int, default=2, help="loader workers (part 2)")
    p.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs per loader process (part 2): samples/s is the median epoch after the "
        "first; the first epoch (worker start included) and first batch are beside it",
    )
    p.add_argument(
        "--loaders",
        default="",
        help="comma-separated loader contenders to run (part 2; default: all of them)",
    )
    p.add_argument("--resume-size", default="1GB", help="size of the one resume shard")
    p.add_argument("--positions", default="0,0.25,0.5,0.75,0.99")
    p.add_argument("--resume-workers", default="0,2")
    p.add_argument("--cold", action="store_true", help="drop the page cache before runs")
    p.add_argument(
        "--piece-sizes",
        default="",
        help="part 1: also read verified ShardDatasets of the same samples written with "
        "these piece sizes (comma list, e.g. 4MiB,1MiB; the default set has 16 MiB)",
    )
    p.add_argument(
        "--as-written",
        action="store_true",
        help="read files in the page-cache state their writers left (no settle)",
    )
    args = p.parse_args()
    parse_common(args)
    args.part_list = args.parts.split(",")
    args.resume_bytes = parse_size(args.resume_size)
    args.position_list = [float(x) for x in args.positions.split(",")]
    args.resume_worker_list = [int(x) for x in args.resume_workers.split(",")]
    args.piece_size_list = [parse_size(x) for x in args.piece_sizes.split(",") if x]
    return args


def run_profile(profile: str, args: Any) -> tuple[list[str], dict[str, Any]]:
    ds = make_dataset(profile, args.size_bytes)
    log(f"read: {describe(ds)}; writing it in every format")
    peers = "loader" in args.part_list
    fm = Formats(ds, args.work, args.shard_bytes, peers=peers, settled=not args.as_written)
    texts, out = [], {"samples": len(ds.samples), "payload_bytes": ds.payload_bytes}
    out["shard_file_bytes"] = fm.sk_bytes
    parts = [("inprocess", part_inprocess), ("foreign", part_foreign), ("gzip", part_gzip)]
    parts.append(("loader", part_loader))
    if profile == "small":
        parts.append(("rss", part_rss))
    for name, fn in parts:
        if name in args.part_list:
            log(f"read {profile}: {name}")
            text, out[name] = fn(ds, fm, args)
            texts.append(f"### read {name}, {describe(ds)}\n\n{text}\n")
    return texts, out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _readers.run_child(sys.argv[2])
        return
    args = parse_args()
    if not has_streaming_api():
        log("shardkit.ShardDataset / WebLoader not found: measuring read_shard and the peers")
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    results["cold"] = args.cold
    results["settled"] = not args.as_written
    results["loadavg_at_start"] = os.getloadavg()
    texts: list[str] = []
    for profile in args.profile_list:
        t, results["profiles"][profile] = run_profile(profile, args)
        texts += t
    if "resume" in args.part_list and has_streaming_api():
        text, results["resume"] = part_resume(args)
        texts.append(f"### resume in one {args.resume_size} shard (small profile)\n\n{text}\n")
    state = "page cache as written" if args.as_written else "files settled (see the docstring)"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    note = f"{reads_note(args.repeats, args.cold)}, {state}; load average at the end {load}"
    finish(args.out, "read", results, texts, note)


if __name__ == "__main__":
    main()
