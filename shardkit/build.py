"""``shardkit build`` as a library: sources in, shards and one checksum manifest out.

:func:`plan_build` reads the sources into a fixed list of input units (see
:mod:`shardkit.sources`) and checks the options and what the output directory already
holds; :func:`run_build` writes the shards; :func:`build` does both.

- ``workers=N`` splits the units into N contiguous groups of about equal bytes, one
  process each. Each writes whole shards into its own work directory; at the end the
  shards are renamed into one contiguous sequence and one manifest is written. The
  split, and so every shard's bytes, depends only on the inputs and N.
- ``part=(i, n)`` builds the i-th of n disjoint, deterministic parts of the inputs, with
  shards named ``{prefix}-p{i:04d}-{index:06d}.tar`` and a partial manifest
  ``manifest.part-{i:04d}-of-{n:04d}.json`` for :meth:`Manifest.merge`.
- ``resume=True`` after a crash keeps the whole shards the manifest lists, skips the
  samples they hold and goes on; nothing is lost or written twice. The manifest records
  a fingerprint of the inputs and options (``created.build``) so a resume with other
  inputs or options is refused, and whether the build finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.build_workers import (
    Progress,
    Reporter,
    build_info,
    finalize,
    make_jobs,
    run_workers,
    write_job,
)
from shardkit.checksum import new_hasher
from shardkit.errors import ConfigError, ManifestError, ShardkitError, WriterError
from shardkit.manifest import Manifest, creation_info
from shardkit.sources import FieldMap, Unit, discover
from shardkit.units import parse_size

__all__ = [
    "BuildConfig",
    "BuildPlan",
    "BuildResult",
    "build",
    "plan_build",
    "run_build",
    "split_contiguous",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildConfig:
    """The options of a build (the ``shardkit build`` flags).

    Args:
        prefix: shard names are ``{prefix}-{index:06d}.tar``.
        maxsize: roll over to a new shard before this many bytes (``"1GB"``).
        maxcount: roll over after this many samples (None: no limit).
        checksum: ``sha256`` or another algorithm of :mod:`shardkit.checksum`.
        compress: None or ``"zstd"``.
        workers: parallel writer processes.
        part: ``(i, n)``: build only part i of n.
        resume: continue an interrupted build in the same directory.
        source_type: how directories are read: ``auto``, ``files``, ``jsonl``, ``tar``.
        fields: JSONL record fields mapped to their own members (``--field``).
        key_field: the JSONL record field that holds the sample key.
    """

    prefix: str = "data"
    maxsize: int | str = "1GB"
    maxcount: int | None = None
    checksum: str = "sha256"
    compress: str | None = None
    workers: int = 1
    part: tuple[int, int] | None = None
    resume: bool = False
    source_type: str = "auto"
    fields: tuple[FieldMap, ...] = ()
    key_field: str | None = None


@dataclass(frozen=True)
class BuildPlan:
    """What :func:`run_build` will do: the units of this part, split between workers."""

    out_dir: str
    config: BuildConfig
    units: tuple[Unit, ...]
    groups: tuple[range, ...]
    fingerprint: str
    done: Manifest | None = None  # a resumed build that had already finished

    @property
    def total_bytes(self) -> int:
        """Input bytes of this part (what a progress bar counts to)."""
        return sum(u.size for u in self.units)

    @property
    def shard_prefix(self) -> str:
        part = self.config.part
        return self.config.prefix if part is None else f"{self.config.prefix}-p{part[0]:04d}"

    @property
    def manifest_name(self) -> str:
        part = self.config.part
        return (
            "manifest.json"
            if part is None
            else f"manifest.part-{part[0]:04d}-of-{part[1]:04d}.json"
        )

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.out_dir, self.manifest_name)

    @property
    def work_dir(self) -> str:
        return os.path.join(self.out_dir, f".{self.shard_prefix}.work")


@dataclass(frozen=True)
class BuildResult:
    """What a build did: the manifest, samples written now and kept from before, time."""

    manifest: Manifest
    manifest_path: str
    samples: int
    resumed_samples: int
    input_bytes: int
    seconds: float
    workers: int

    def to_dict(self) -> dict[str, Any]:
        secs = max(self.seconds, 1e-9)
        return {
            "manifest": self.manifest_path,
            "shards": len(self.manifest),
            "samples": self.manifest.total_samples,
            "bytes": self.manifest.total_bytes,
            "written_samples": self.samples,
            "resumed_samples": self.resumed_samples,
            "input_bytes": self.input_bytes,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples / secs, 1),
            "mb_per_s": round(self.input_bytes / secs / 1e6, 2),
            "workers": self.workers,
            "part": list(self.manifest.part.values()) if self.manifest.part else None,
        }


# -- planning ----------------------------------------------------------------------------
def _check_config(c: BuildConfig) -> None:
    if not c.prefix or "/" in c.prefix or c.prefix.startswith(".") or "{" in c.prefix:
        raise ConfigError(f"bad shard prefix {c.prefix!r}")
    if parse_size(c.maxsize) < 4096:
        raise ConfigError(f"maxsize {c.maxsize!r} is too small (at least 4 KB)")
    if c.maxcount is not None and c.maxcount < 1:
        raise ConfigError(f"maxcount must be at least 1, got {c.maxcount}")
    new_hasher(c.checksum)
    if c.compress not in (None, "zstd"):
        raise ConfigError(f"compress must be None or 'zstd', got {c.compress!r}")
    if c.workers < 1:
        raise ConfigError(f"workers must be at least 1, got {c.workers}")
    if c.part is not None and not (0 <= c.part[0] < c.part[1]):
        raise ConfigError(f"part must be I/N with 0 <= I < N, got {c.part[0]}/{c.part[1]}")


def _fingerprint(units: Sequence[Unit], c: BuildConfig, workers: int) -> str:
    h = hashlib.sha256()
    for u in units:
        h.update(json.dumps([u.kind, os.path.abspath(u.path), u.size, u.name, u.members]).encode())
    opts = dataclasses.asdict(dataclasses.replace(c, resume=False, workers=workers))
    opts["maxsize"] = parse_size(c.maxsize)
    h.update(json.dumps(opts, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _previous(plan: BuildPlan) -> Manifest | None:
    """Check what the output holds against this plan; the finished manifest, if any."""
    path, work, resume = plan.manifest_path, plan.work_dir, plan.config.resume
    state = os.path.join(work, "build.json")
    if os.path.exists(work) and not resume:
        raise ConfigError(f"{work} holds an interrupted build: pass --resume to finish it")
    if os.path.exists(state):
        with open(state, encoding="utf-8") as f:
            if json.load(f).get("config") != plan.fingerprint:
                raise ConfigError(_MISMATCH.format(path=work))
    if not os.path.exists(path):
        return None
    if not resume:
        raise ConfigError(f"{path} exists: pass --resume to finish that build, or use another -o")
    old = Manifest.load(path)
    info = build_info(old)
    if info.get("config") != plan.fingerprint:
        raise ConfigError(_MISMATCH.format(path=path))
    return old if info.get("complete") and not os.path.exists(work) else None


_MISMATCH = (
    "cannot resume: {path} was built from other inputs or options "
    "(resume needs the same sources, --workers, --part, sizes and fields)"
)


def plan_build(
    sources: Sequence[str], out_dir: str | os.PathLike[str], config: BuildConfig | None = None
) -> BuildPlan:
    """Find the inputs, split them into parts and workers, check the output directory.

    Raises :class:`ConfigError` for bad options, missing sources or an output directory
    that holds another build (or an interrupted one while ``resume`` is off).
    """
    c = config or BuildConfig()
    _check_config(c)
    out = os.path.abspath(os.fspath(out_dir))
    if not sources:
        raise ConfigError("no sources given")
    units = discover(sources, source_type=c.source_type, exclude=[out])
    if not units:
        raise ConfigError(f"found no input in {', '.join(map(str, sources))}")
    if c.part is not None:
        r = split_contiguous([u.size for u in units], c.part[1])[c.part[0]]
        units = units[r.start : r.stop]
    workers = max(1, min(c.workers, len(units)))
    groups = tuple(split_contiguous([u.size for u in units], workers))
    plan = BuildPlan(out, c, tuple(units), groups, _fingerprint(units, c, workers))
    done = _previous(plan)
    return dataclasses.replace(plan, done=done) if done is not None else plan


def run_build(plan: BuildPlan, *, progress: Progress | None = None) -> BuildResult:
    """Write the shards and the manifest of ``plan``.

    ``progress(samples, input_bytes)`` is called about ten times a second in this process
    with what was done since the last call. Raises :class:`ShardkitError` subclasses for
    bad input (naming the file and line) and keeps the whole shards written so far, so
    the build can be resumed. A write that fails (a full disk) is a :class:`WriterError`.
    """
    try:
        return _run_build(plan, progress)
    except ShardkitError:
        raise
    except OSError as exc:  # the work dir, a move or the final manifest: disk full
        where = exc.filename or plan.out_dir
        raise WriterError(f"{where}: {exc.strerror or exc}; the build stopped") from exc


def _run_build(plan: BuildPlan, progress: Progress | None) -> BuildResult:
    t0 = time.perf_counter()
    nbytes = 0

    def count(samples: int, b: int) -> None:
        nonlocal nbytes
        nbytes += b
        if progress is not None:
            progress(samples, b)

    if plan.done is not None:
        if progress is not None:
            progress(0, plan.total_bytes)
        written, kept, manifest = 0, plan.done.total_samples, plan.done
    elif len(plan.groups) == 1:
        written, kept = write_job(make_jobs(plan)[0], Reporter(count))
        manifest = Manifest.load(plan.manifest_path)
    else:
        written, _ = run_workers(plan, count)
        manifest = finalize(plan)
        kept = manifest.total_samples - written
    secs = time.perf_counter() - t0
    log.info("built %d shards, %d samples in %.2f s", len(manifest), manifest.total_samples, secs)
    return BuildResult(manifest, plan.manifest_path, written, kept, nbytes, secs, len(plan.groups))


def build(
    sources: Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    **options: Any,
) -> BuildResult:
    """Build shards from ``sources`` into ``out_dir``; ``options`` are :class:`BuildConfig`'s.

    ``build(["raw/"], "shards/", maxsize="512MB", workers=2)``. With ``workers > 1`` the
    workers are started with ``spawn``, so a script that calls this must guard its entry
    point with ``if __name__ == "__main__":`` (the usual multiprocessing rule).
    """
    return run_build(plan_build(sources, out_dir, BuildConfig(**options)), progress=progress)


def merge_parts(
    paths: Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    *,
    allow_incomplete: bool = False,
) -> Manifest:
    """Join the partial manifests of ``build --part`` into one manifest at ``out_path``.

    Refuses a part whose build did not finish, and a set of parts with one missing
    (unless ``allow_incomplete``); urls are rewritten relative to ``out_path``'s
    directory, which must hold every shard.
    """
    parts = [Manifest.load(p) for p in paths]
    for path, m in zip(paths, parts, strict=True):
        info = build_info(m)
        if info and not info.get("complete"):
            raise ManifestError(
                "this part's build did not finish: run it again with --resume", path=str(path)
            )
    merged = Manifest.merge(parts)
    incomplete = merged.created.get("incomplete")
    if incomplete and not allow_incomplete:
        count = next(p.part["count"] for p in parts if p.part is not None)
        have = {p.part["index"] for p in parts if p.part is not None}
        missing = ", ".join(str(i) for i in range(count) if i not in have)
        raise ManifestError(f"only {incomplete} given: part {missing} missing")
    out = os.path.abspath(os.fspath(out_path))
    base = os.path.dirname(out)
    shards = []
    for s in merged.shards:
        url = merged.rebase(s.url, base)
        index = merged.rebase(s.index, base) if s.index else None
        if os.path.isabs(url) or url.startswith("../"):
            raise ManifestError(
                f"shard {url} is outside {base}; write the merged manifest higher up"
            )
        shards.append(dataclasses.replace(s, url=url, index=index))
    merged.shards, merged.base = shards, base
    merged.created = creation_info(merged_parts=len(parts))
    if incomplete:
        merged.created["incomplete"] = incomplete
    merged.save(out)
    return merged


def split_contiguous(sizes: Sequence[int], n: int) -> list[range]:
    """Split items into ``n`` contiguous groups of about equal total size.

    Item ``i`` goes to the group its midpoint falls in, so the split is deterministic,
    groups are contiguous and in order, and an item is never divided. Some groups are
    empty when there are fewer items than groups.
    """
    if n < 1:
        raise ConfigError(f"cannot split into {n} groups")
    total = sum(sizes)
    bounds = [0] * (n + 1)
    acc = 0
    for i, size in enumerate(sizes):
        if total > 0:
            group = min(n - 1, (2 * acc + size) * n // (2 * total))
        else:
            group = min(n - 1, i * n // len(sizes))
        bounds[group + 1] = i + 1
        acc += size
    for g in range(1, n + 1):
        bounds[g] = max(bounds[g], bounds[g - 1])
    return [range(bounds[g], bounds[g + 1]) for g in range(n)]
