"""``shardkit cache stat|warm|clean|verify``: look at, fill, empty and scrub a node-local
shard cache.

``stat``, ``clean`` and ``verify`` take the cache dir as an argument (``cache stat DIR``);
every command also takes ``--cache-dir`` or ``SHARDKIT_CACHE_DIR``. ``warm`` pre-fetches
the shards one rank reads in an epoch (by default the next run's first epoch, rank 0 of 1:
every shard), in that rank's order, so training starts from local disk.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from tqdm import tqdm

from shardkit._types import ObjectRef
from shardkit.cache import CacheStore, CachingOpener, upkeep
from shardkit.cache.folder import refuse_foreign
from shardkit.errors import CacheError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import INDEX_MAGIC, INDEX_MAGICS
from shardkit.io import CacheConfig, IoConfig, load_manifest
from shardkit.plan.assign import PlanConfig, worker_stream
from shardkit.plan.ranges import Ranges
from shardkit.plan.world import Context
from shardkit.units import format_bytes, parse_size, plural
from shardkit.urls import url_scheme

__all__ = ["command"]

_CACHE_DIR = click.option(
    "--cache-dir",
    envvar="SHARDKIT_CACHE_DIR",
    required=True,
    type=click.Path(file_okay=False),
    help="The node-local cache directory (or SHARDKIT_CACHE_DIR).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
F = TypeVar("F", bound=Callable[..., Any])
COMMANDLINE = ParameterSource.COMMANDLINE


def _cache_dir_arg(f: F) -> F:
    """``DIR`` as an argument (``cache stat /nvme/cache``), or ``--cache-dir`` / the
    environment as for ``warm``; the command gets it as ``cache_dir``."""

    @functools.wraps(f)
    def wrapper(directory: str | None, cache_dir: str | None, **kw: Any) -> Any:
        given = click.get_current_context().get_parameter_source("cache_dir")
        if directory and cache_dir and directory != cache_dir and given is COMMANDLINE:
            raise click.UsageError(f"two cache dirs: {directory} and --cache-dir {cache_dir}")
        where = directory or cache_dir  # DIR wins over SHARDKIT_CACHE_DIR
        if not where:
            raise click.UsageError("give the cache dir: DIR, --cache-dir or SHARDKIT_CACHE_DIR")
        return f(cache_dir=where, **kw)

    arg = click.argument(
        "directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False)
    )
    opt = click.option(
        "--cache-dir",
        envvar="SHARDKIT_CACHE_DIR",
        type=click.Path(file_okay=False),
        help="The cache directory, if not given as DIR (or SHARDKIT_CACHE_DIR).",
    )
    return arg(opt(wrapper))  # type: ignore[return-value]


def _existing(cache_dir: str) -> CacheStore:
    """The cache at ``cache_dir`` for stat, verify and clean: never created, never a folder
    of something else (clean would remove files under its ``data/``)."""
    if not os.path.isdir(cache_dir):
        raise CacheError(f"no cache at {cache_dir}: the folder does not exist")
    refuse_foreign(cache_dir)
    return CacheStore(cache_dir)


@click.group("cache")
def command() -> None:
    """Inspect, pre-fill (warm) and empty a node-local shard cache."""


def _kinds(store: CacheStore) -> dict[str, int]:
    """Cached objects by kind: shards and sample indexes (told apart by the index magic)."""
    out = {"shards": 0, "shard_bytes": 0, "indexes": 0, "index_bytes": 0}
    for s in store.shards():
        try:
            with open(s.path, "rb") as f:
                head = f.read(len(INDEX_MAGIC))
        except FileNotFoundError:
            continue  # evicted meanwhile
        if head in INDEX_MAGICS:
            out["indexes"] += 1
            out["index_bytes"] += s.size
        else:
            out["shards"] += 1
            out["shard_bytes"] += s.size
    return out


@command.command("stat")
@_cache_dir_arg
@click.option(
    "--limit",
    envvar="SHARDKIT_CACHE_LIMIT",
    default=None,
    help="The byte limit the cache is used with (500GB), to show how full it is.",
)
@_JSON
def stat(cache_dir: str, limit: str | None, as_json: bool) -> None:
    """What the cache holds: shards, sample indexes, bytes against the limit, shards in
    use, downloads in progress."""
    store = _existing(cache_dir)
    st = upkeep.stat(store)
    d: dict[str, Any] = dataclasses.asdict(st)
    d["objects"] = d.pop("shards")  # every cached file; "shards" counts tar shards only
    kinds = _kinds(store)
    d.update(kinds)
    cap = parse_size(limit) if limit else None
    d["limit"] = cap
    d["used_fraction"] = (st.bytes + st.downloading_bytes) / cap if cap else None
    if as_json:
        click.echo(json.dumps(d, indent=1))
        return
    click.echo(f"cache {st.root}")
    click.echo(
        f"  {plural(kinds['shards'], 'shard')} ({format_bytes(kinds['shard_bytes'])}), "
        f"{plural(kinds['indexes'], 'sample index', 'sample indexes')} "
        f"({format_bytes(kinds['index_bytes'])})"
    )
    used = format_bytes(st.bytes)
    if cap:
        click.echo(f"  {used} of the {format_bytes(cap)} limit ({d['used_fraction']:.0%} used)")
    else:
        click.echo(f"  {used} in all (limit: give --limit or SHARDKIT_CACHE_LIMIT to compare)")
    click.echo(f"  {st.in_use} being read, {st.downloading} downloading")
    if st.dead_temp_files:
        click.echo(f"  {st.dead_temp_files} temp files of dead downloads (clean removes them)")
    if st.oldest_use is not None:
        oldest = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.oldest_use))
        click.echo(f"  least recently used: {oldest}")


def rank_shards(
    m: Manifest, *, seed: int, epoch: int, rank: int, world: int, shuffle: bool, remainder: str
) -> list[int]:
    """The shards ``rank`` reads in ``epoch``, in the order it reads them (shardkit.plan.assign)."""
    counts = [s.nsamples for s in m.shards]
    mine = worker_stream(
        counts, PlanConfig(seed, shuffle, remainder), Context(rank, world, epoch=epoch)
    )
    assert isinstance(mine, Ranges)  # not resampled
    return mine.shards()


def _shard_range(text: str | None, n: int) -> range:
    if text is None:
        return range(n)
    lo, sep, hi = text.partition(":")
    if not sep or not all(x.isdigit() for x in (lo, hi) if x):
        raise click.BadParameter(
            f"expected START:STOP (shard numbers, 0 or more), got {text!r}", param_hint="--shards"
        )
    return range(int(lo or 0), min(n, int(hi) if hi else n))


@command.command("warm")
@click.argument("manifest")
@_CACHE_DIR
@click.option("--limit", default=None, help="The cache's byte limit, as in training (500GB).")
@click.option("--rank", type=int, default=0, envvar="RANK", show_default=True)
@click.option("--world-size", type=int, default=1, envvar="WORLD_SIZE", show_default=True)
@click.option("--epoch", type=int, default=0, show_default=True, help="The epoch to warm for.")
@click.option("--seed", type=int, default=0, show_default=True, help="The data order seed.")
@click.option("--no-shuffle", is_flag=True, help="Shards in manifest order (shardshuffle off).")
@click.option("--remainder", type=click.Choice(["drop", "pad"]), default="drop")
@click.option("--shards", "shard_range", default=None, help="Only manifest shards START:STOP.")
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--endpoint-url", default=None, help="S3-compatible endpoint for s3:// urls.")
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar (default: on a terminal)."
)
@_JSON
def warm(manifest: str, cache_dir: str, limit: str | None, **opts: Any) -> None:
    """Pre-fetch into the cache the shards a rank reads in an epoch, in its order."""
    cache = CacheConfig(cache_dir=cache_dir, cache_limit=parse_size(limit) if limit else None)
    cfg = IoConfig(cache=cache, endpoint_url=opts["endpoint_url"])
    opener = CachingOpener(cfg)
    m = load_manifest(manifest, opener)
    ids = rank_shards(
        m,
        seed=opts["seed"],
        epoch=opts["epoch"],
        rank=opts["rank"],
        world=opts["world_size"],
        shuffle=not opts["no_shuffle"],
        remainder=opts["remainder"],
    )
    wanted = set(_shard_range(opts["shard_range"], len(m.shards)))
    ids = [i for i in ids if i in wanted]
    local = [m.shards[i].url for i in ids if url_scheme(m.resolve(m.shards[i].url)) == "file"]
    if local:
        raise CacheError(
            f"{manifest}: shard {local[0]} is on local disk, read where it is: cache warm "
            "fetches remote shards (http, s3, gs, az, hf)"
        )
    outcomes = _warm(opener, m, ids, opts["jobs"], opts["progress"])
    summary = {k: outcomes.count(k) for k in ("cached", "fetched", "shared", "no room")}
    summary["shards"] = len(ids)
    if opts["as_json"]:
        click.echo(json.dumps({"summary": summary, "io": opener.stats()}, indent=1))
        return
    click.echo(
        f"warmed {plural(len(ids), 'shard')}: {summary['fetched']} fetched, "
        f"{summary['cached']} already "
        f"cached, {summary['shared']} fetched by another process, {summary['no room']} "
        "did not fit"
    )


def _warm(
    opener: CachingOpener, m: Manifest, ids: list[int], jobs: int, progress: bool | None
) -> list[str]:
    bar = tqdm(
        total=sum(m.shards[i].size for i in ids),
        unit="B",
        unit_scale=True,
        desc="warm",
        disable=None if progress is None else not progress,
    )
    lock = threading.Lock()

    def one(i: int) -> str:
        s = m.shards[i]
        got = opener.ensure_cached(ObjectRef(m.resolve(s.url), s.size, s.checksum, s.pieces))
        with lock:
            bar.update(s.size)
        return got

    try:
        with ThreadPoolExecutor(jobs) as pool:
            return list(pool.map(one, ids))
    finally:
        bar.close()


@command.command("verify")
@_cache_dir_arg
@_JSON
def verify_cache(cache_dir: str, as_json: bool) -> None:
    """Hash every cached shard again; evict what no longer matches (exit 1 if any)."""
    store = _existing(cache_dir)
    total = sum(s.size for s in store.shards())
    with tqdm(total=total, unit="B", unit_scale=True, disable=as_json, desc="verify") as bar:
        bad = upkeep.scrub(store, progress=bar.update)
    if as_json:
        click.echo(json.dumps({"bad": [{"path": p, "what": w} for p, w in bad]}, indent=1))
    else:
        for path, what in bad:
            click.echo(f"BAD {path}: {what}")
        click.echo(f"{len(bad)} bad of {format_bytes(total)} checked")
    if bad:
        raise SystemExit(1)


@command.command("clean")
@_cache_dir_arg
@click.option("--keep", default=None, help="Evict least recently used shards down to this size.")
@click.option("--all", "everything", is_flag=True, help="Evict every shard not being read.")
@_JSON
def clean(cache_dir: str, keep: str | None, everything: bool, as_json: bool) -> None:
    """Evict shards (never one being read) and remove temp files of dead downloads."""
    if (keep is None) == (not everything):
        raise click.UsageError("give one of --keep SIZE or --all")
    store = _existing(cache_dir)
    n, freed = upkeep.clean(store, keep=0 if everything else parse_size(str(keep)))
    left = upkeep.stat(store)
    if as_json:
        out = {"evicted": n, "freed": freed, "left": dataclasses.asdict(left)}
        click.echo(json.dumps(out, indent=1))
        return
    click.echo(
        f"evicted {plural(n, 'shard')} ({format_bytes(freed)}); {left.shards} left, "
        f"{left.in_use} of them being read"
    )
