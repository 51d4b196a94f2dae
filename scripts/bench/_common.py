"""Shared pieces of the benchmarks: data profiles, timing, medians, tables, JSON results.

Every benchmark runs all contenders on the same data in the same run, interleaved
(repetition 1 of every contender, then repetition 2, ...) so that a noisy neighbour on
the shared machine hits them alike, and reports medians and ratios.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.format.codecs import encode_field
from shardkit.units import format_bytes, parse_size

PROFILES = ("small", "medium")
SMALL_TOKENS = 960  # int32 tokens: a 3,968-byte npy field, ~4.1 KB per sample with the json
MEDIUM_BIN = 150_000
POOL = 256  # distinct payloads, reused cyclically: the data is generated once, not per run


@dataclass
class Dataset:
    """The samples of one profile, shared by every contender of a run."""

    profile: str
    samples: list[dict[str, Any]]
    payload_bytes: int  # encoded field bytes, the denominator of every MB/s


def _small(i: int, tokens: list[np.ndarray]) -> dict[str, Any]:
    return {
        "__key__": f"s{i:09d}",
        "json": {"id": i, "text": f"document {i} of the small profile", "lang": "en"},
        "tokens.npy": tokens[i % len(tokens)],
    }


def _medium(i: int, blobs: list[bytes]) -> dict[str, Any]:
    return {
        "__key__": f"m{i:09d}",
        "bin": blobs[i % len(blobs)],
        "cls": i % 1000,
        "json": {"id": i, "caption": f"medium sample {i}"},
    }


def sample_bytes(sample: dict[str, Any]) -> int:
    """Payload bytes of one sample: its fields encoded as shardkit stores them."""
    key = sample["__key__"]
    return sum(len(encode_field(key, f, v)) for f, v in sample.items() if f != "__key__")


def make_dataset(profile: str, total: int, *, seed: int = 0) -> Dataset:
    """About ``total`` payload bytes of ``profile`` samples (deterministic)."""
    rng = np.random.default_rng(seed)
    if profile == "small":
        pool: Any = [
            rng.integers(0, 50_000, size=SMALL_TOKENS, dtype=np.int32) for _ in range(POOL)
        ]
        make: Callable[[int, Any], dict[str, Any]] = _small
    elif profile == "medium":
        pool = [rng.bytes(MEDIUM_BIN) for _ in range(POOL)]
        make = _medium
    else:
        raise SystemExit(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    per = sample_bytes(make(0, pool))
    n = max(1, total // per)
    samples = [make(i, pool) for i in range(n)]
    payload = sum(sample_bytes(s) for s in samples[: min(n, 1000)])
    payload = payload * n // min(n, 1000)
    return Dataset(profile, samples, payload)


# -- arguments ---------------------------------------------------------------------------
_START_COMMIT: list[str | None] = []  # the tree may move on during a long run


def git_commit() -> str | None:
    """The short commit of the checkout these scripts are in, if any."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or None


def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes."""
    _START_COMMIT[:] = [git_commit()]
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--size", default="1GB", help="payload bytes per profile (e.g. 100MB)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions (medians reported)")
    p.add_argument("--profiles", default="small,medium", help="comma list: small,medium")
    p.add_argument("--shard-size", default="256MB", help="shard / chunk size for all formats")
    p.add_argument("--work", default="bench-out/data", help="scratch directory for the data")
    p.add_argument("--out", default="bench-out", help="directory for the JSON results")
    return p


def parse_common(args: argparse.Namespace) -> None:
    """Normalise the common options in place."""
    args.size_bytes = parse_size(args.size)
    args.shard_bytes = parse_size(args.shard_size)
    args.profile_list = [p.strip() for p in args.profiles.split(",") if p.strip()]
    for p in args.profile_list:
        if p not in PROFILES:
            raise SystemExit(f"unknown profile {p!r}; choose from {', '.join(PROFILES)}")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)


# -- measuring ---------------------------------------------------------------------------
@dataclass
class Series:
    """Repeated measurements of one contender."""

    name: str
    seconds: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once; return (seconds, its result)."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleave(
    repeats: int, contenders: Sequence[tuple[str, Callable[[], Any]]], *, before: Callable[[], None]
) -> dict[str, Series]:
    """Run every contender ``repeats`` times, rotating the order each repetition."""
    series = {name: Series(name) for name, _ in contenders}
    for rep in range(repeats):
        k = rep % len(contenders)
        for name, fn in list(contenders[k:]) + list(contenders[:k]):
            before()
            cpu0 = time.process_time()  # this process's CPU (user + system), not a child's
            sec, extra = timed(fn)
            series[name].seconds.append(sec)
            series[name].extra.setdefault("cpu_s", []).append(time.process_time() - cpu0)
            if isinstance(extra, dict):
                for key, value in extra.items():
                    series[name].extra.setdefault(key, []).append(value)
            log(f"  rep {rep + 1}/{repeats} {name:<28} {sec:8.3f} s")
    return series


def rate_row(
    s: Series, n: int, nbytes: int, wds: float, raw: float | None, *, what: str = "payload"
) -> tuple[dict[str, Any], list[str]]:
    """One contender's JSON record and table row: median seconds, samples/s, MB/s of
    ``nbytes`` (named ``what``), bytes on disk over ``nbytes``, speed-up over webdataset's
    median ``wds``, and the share of the raw limit's median ``raw`` (None: no raw peer)."""
    med = s.median
    disk = s.extra["disk_bytes"][-1] / nbytes
    pct = raw / med * 100 if raw else None
    rec = {
        "name": s.name,
        "median_s": med,
        "seconds": s.seconds,
        "samples_per_s": n / med,
        f"{what}_mb_per_s": nbytes / med / 1e6,
        f"disk_over_{what}": disk,
        "x_webdataset": wds / med,
        "pct_of_raw": pct,
    }
    row = [
        s.name,
        fmt(med, ".2f"),
        fmt(n / med),
        fmt(nbytes / med / 1e6),
        fmt(disk, ".3f"),
        fmt(wds / med, ".2f") + "x",
        fmt(pct, ".0f") + ("%" if pct else ""),
    ]
    return rec, row


def sync() -> None:
    """Push dirty pages out so one contender's writeback does not slow the next."""
    os.sync()


def before_runs(cold: bool) -> Callable[[], None]:
    """What runs before every timed run: sync, and with ``cold`` drop the page cache."""

    def before() -> None:
        sync()
        if cold:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")

    return before


def settle(paths: Iterable[str]) -> None:
    """Put files in the page cache as a read from disk leaves them, whoever wrote them.

    How a file got into the page cache sets what a warm read of it costs: a file written
    in small pieces (Python's ``tarfile``, as ``webdataset.ShardWriter`` writes) sits in
    small pages that the kernel copies out ~3x slower than the large ones that a read from
    disk or a download in large writes leaves. Each file is written back, dropped from the
    cache (its own pages only) and read once, so every format is read from the same state.
    """
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)


def run_script(script: str, flag: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``script flag SPEC`` in a fresh interpreter; return the JSON of its last line."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(script), flag, json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{flag} {spec.get('kind')} {spec.get('impl')} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def dir_bytes(path: str) -> int:
    """Bytes of all files under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def fresh_dir(path: str) -> str:
    """An empty directory at ``path``."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- reporting ---------------------------------------------------------------------------
def fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    rows = [list(r) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, sep, *body])


def environment() -> dict[str, Any]:
    """Facts about the machine and versions, stored with every result."""
    import importlib.metadata as md

    versions = {}
    for dist in ("shardkit", "webdataset", "mosaicml-streaming", "litdata", "torch", "numpy"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit_at_start": _START_COMMIT[0] if _START_COMMIT else None,
        "commit_at_end": git_commit(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "argv": sys.argv,
        "versions": versions,
    }


def save_results(out_dir: str, name: str, results: dict[str, Any]) -> str:
    """Write ``results`` (plus the environment) to ``out_dir/name-<time>.json``."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(out_dir, f"{name}-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": name, "env": environment(), **results}, f, indent=1)
    return path


def finish(out_dir: str, name: str, results: dict[str, Any], texts: list[str], note: str) -> None:
    """Save the JSON results, print the tables and a closing note naming the file."""
    path = save_results(out_dir, name, results)
    print("\n".join(texts))
    print(f"({note}; JSON: {path})")


def reads_note(repeats: int, cold: bool) -> str:
    cache = "cold (page cache dropped)" if cold else "warm page-cache"
    return f"medians of {repeats}; {cache} reads"


def describe(ds: Dataset) -> str:
    return f"{ds.profile}: {len(ds.samples):,} samples, {format_bytes(ds.payload_bytes)} payload"
