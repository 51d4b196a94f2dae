"""Check that a manifest's shards are what it promises.

Three levels: ``quick`` (each shard exists and has its size), ``checksum`` (the default:
size and checksum of every byte, and each shard's sample index file: there, the one the
manifest's ``index_checksum`` vouches for, of the shard's count) and ``deep`` (also parse
every shard with the tar reader: its sample count, its ``.idx`` sample index, hostile or
broken members). Shards are read through the io seam (an
:class:`~shardkit._types.Opener`), so the same check runs on local files and remote urls.
Every shard is read once: in ``deep`` mode the tar reader reads through a tee that hashes
what passes, so parsing costs no second read.

Each problem names the shard, what is wrong, and the expected and found values; one
shard's check is :func:`shardkit.check.shard.verify_shard`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from shardkit.check.report import Problem, VerifyReport
from shardkit.check.shard import Progress, verify_shard
from shardkit.errors import ConfigError, ShardkitError
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.manifest.model import Manifest, ShardEntry, incomplete_reason
from shardkit.io import IoConfig, UncachedOpener, load_manifest
from shardkit.units import plural
from shardkit.urls import WithinBase
from shardkit.values import as_int

if TYPE_CHECKING:
    from shardkit._types import Opener

__all__ = ["LEVELS", "extra_files", "verify"]

log = logging.getLogger(__name__)

LEVELS = ("quick", "checksum", "deep", "decode")


def _skip_note(url: str, kinds: dict[str, int], tar_policy: str) -> str:
    what = ", ".join(f"{n} {k}" for k, n in kinds.items())
    return (
        f"{url}: skipped {plural(sum(kinds.values()), 'member')} ({what}) under the "
        f"{tar_policy} tar policy"
    )


def extra_files(manifest: Manifest) -> list[str]:
    """Shard-like files beside a local manifest's shards that it does not list."""
    base = manifest.base
    if base is None or "://" in base:
        return []
    listed: set[str] = set()
    for entry in manifest.shards:
        try:
            listed.add(os.path.normpath(manifest.resolve(entry.url)))
        except ShardkitError:
            continue
    dirs = {base} | {os.path.dirname(p) for p in listed}
    found: list[str] = []
    for d in sorted(dirs):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            if name.startswith(".") or not name.endswith(SHARD_SUFFIXES) or path in listed:
                continue
            if os.path.isfile(path):
                found.append(os.path.relpath(path, base))
    return sorted(found)


def verify(
    manifest: Manifest | str | os.PathLike[str],
    *,
    level: str = "checksum",
    jobs: int = 1,
    opener: Opener | None = None,
    progress: Progress | None = None,
    source: str | None = None,
    tar_policy: str = "strict",
) -> VerifyReport:
    """Check every shard of ``manifest`` at ``level`` with ``jobs`` threads
    (``sk.verify("shards/manifest.json", level="deep").ok``).

    Args:
        manifest: a manifest's path or url, or a loaded manifest (its ``base`` resolves
            relative urls).
        level: ``quick``, ``checksum`` (default; also each sample index file), ``deep`` or
            ``decode`` (``deep`` and every image, npy, json and text field decoded:
            :mod:`shardkit.check.decoded`).
        jobs: shards checked at once (threads: hashing releases the GIL).
        opener: where bytes come from (default: local files and remote urls read directly,
            no cache; :func:`shardkit.cache.make_opener` for one).
        progress: called with byte counts as they are checked (thread-safe callers only).
        source: the manifest's name for the report (default: the path or url given).
        tar_policy: the tar reader's policy for the deep levels: ``"strict"`` (default)
            reports a link, device, FIFO or unknown member type as a ``format`` problem,
            ``"lenient"`` skips it, counted in the report's ``skipped_members`` and warned.
    """
    if level not in LEVELS:
        raise ConfigError(f"level must be one of {LEVELS}, got {level!r}")
    if not isinstance(manifest, Manifest | str | os.PathLike):
        raise TypeError(
            "verify: manifest must be a path, a url or a Manifest, "
            f"not {type(manifest).__name__} {manifest!r:.80}"
        )
    jobs = as_int(jobs, "verify: jobs", low=1, floats=False)
    t0 = time.perf_counter()
    opener = opener or UncachedOpener(IoConfig())
    if not isinstance(manifest, Manifest):
        source = source or os.fspath(manifest)
        manifest = load_manifest(os.fspath(manifest), opener)

    within = WithinBase(manifest.base)
    skipped: dict[str, dict[str, int]] = {}  # one key per shard: threads never share one

    def one(entry: ShardEntry) -> list[Problem]:
        return verify_shard(
            manifest,
            entry,
            level=level,
            opener=opener,
            progress=progress,
            within=within,
            tar_policy=tar_policy,
            skipped=skipped,
        )

    results: Iterable[list[Problem]]
    if jobs > 1 and len(manifest.shards) > 1:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="verify") as pool:
            results = list(pool.map(one, manifest.shards))
    else:
        results = [one(e) for e in manifest.shards]
    report = VerifyReport(
        manifest=source or manifest.base or "<manifest>",
        level=level,
        shards=len(manifest.shards),
        bytes=manifest.total_bytes,
        problems=[p for r in results for p in r],
        warnings=[f"extra file not in the manifest: {x}" for x in extra_files(manifest)],
        incomplete=incomplete_reason(manifest),
        skipped_members={e.url: skipped[e.url] for e in manifest.shards if e.url in skipped},
    )
    report.warnings += [
        _skip_note(url, kinds, tar_policy) for url, kinds in report.skipped_members.items()
    ]
    report.seconds = time.perf_counter() - t0
    log.info(
        "verified %d shards at level %s: %d problems", report.shards, level, len(report.problems)
    )
    return report
