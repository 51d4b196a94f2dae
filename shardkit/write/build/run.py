"""``shardkit build`` as a library: sources in, shards and one checksum manifest out.

:func:`plan_build` reads the sources into a fixed list of input units (see
:mod:`shardkit.write.inputs.sources`), chooses the output's target (a folder or an
object-store prefix: :mod:`shardkit.write.writer.target`) and checks what it already holds;
:func:`run_build` writes the shards; :func:`build` does both.

- ``workers=N`` splits the units into N contiguous groups of about equal bytes, one
  process each. Each writes whole shards into a place of its own (a work folder, or names
  of its own in a store); :mod:`shardkit.write.build.join` then writes one manifest over
  them. The split, and so every shard's bytes, depends only on the inputs and N. Until
  then the output holds a manifest of no shards marked unfinished, which names
  ``--resume``.
- ``part=(i, n)`` builds the i-th of n disjoint, deterministic parts of the inputs, with
  shards named ``{prefix}-p{i:04d}-{index:06d}.tar`` and a partial manifest
  ``manifest.part-{i:04d}-of-{n:04d}.json`` for :mod:`shardkit.write.build.merge`.
- ``resume=True`` after a crash keeps the whole shards the manifest lists, skips the
  samples they hold and goes on; nothing is lost or written twice. The manifest records
  a fingerprint of the inputs and options (``created.build``) so a resume with other
  inputs or options is refused, and whether the build finished (a manifest of a build
  that did not finish fails ``verify`` and is refused by readers). ``overwrite=True``
  starts over.
- One build per output at a time: a build locks its manifest name and shard prefix (an
  ``flock`` in a folder, lock objects in a store); a second one fails at once naming the
  first's pid and host.
- ``on_error="skip"`` leaves bad records out and names them in
  ``manifest.errors.jsonl``; the default stops at the first. A build that skips every
  record is an error, not an empty set.
- ``build(fn, inputs, out)`` builds from a function of your own (see :func:`build`).

The options and plan are in :mod:`shardkit.write.build.config`, planning in
:mod:`shardkit.write.build.plan`, the processes in :mod:`shardkit.write.build.workers`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from shardkit.errors import ConfigError, ShardkitError, WriterError
from shardkit.format.manifest.model import Manifest, creation_info
from shardkit.write.build.config import BuildConfig, BuildPlan, BuildResult
from shardkit.write.build.join import JoinSpec, join_workers
from shardkit.write.build.plan import check_unchanged, clear_output, output_lock, plan_build
from shardkit.write.build.workers import (
    Progress,
    Reporter,
    make_jobs,
    run_workers,
    stop_reason,
    write_job,
)
from shardkit.write.writer.target import build_info, store_failures

__all__ = ["build", "run_build"]

log = logging.getLogger(__name__)


def run_build(plan: BuildPlan, *, progress: Progress | None = None) -> BuildResult:
    """Write the shards and the manifest of ``plan``.

    ``progress(samples, input_bytes)`` is called about ten times a second in this process
    with what was done since the last call. Raises :class:`ShardkitError` subclasses for
    bad input (naming the file and line) and keeps the whole shards written so far, so
    the build can be resumed; its manifest says it is incomplete and why. A write that
    fails (a full disk) is a :class:`WriterError`.
    """
    try:
        with store_failures(plan.out_dir), output_lock(plan):
            check_unchanged(plan)
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

    if plan.config.overwrite:
        clear_output(plan)
    if plan.done is not None:
        log.info("%s is a finished build of these inputs: nothing to do", plan.manifest_path)
        if progress is not None:
            progress(0, plan.total_bytes)
        written, kept, manifest = 0, plan.done.total_samples, plan.done
    elif len(plan.groups) == 1:
        written, kept = write_job(make_jobs(plan)[0], Reporter(count))
        found = plan.target.read_manifest()
        if found is None:
            raise WriterError(f"{plan.manifest_path} is missing after the build wrote it")
        manifest = found
    else:
        written, manifest = _run_workers(plan, count)
        kept = manifest.total_samples - written
    secs = time.perf_counter() - t0
    log.info("built %d shards, %d samples in %.2f s", len(manifest), manifest.total_samples, secs)
    unchanged = plan.done is not None
    return BuildResult(
        manifest, plan.manifest_path, written, kept, nbytes, secs, len(plan.groups), unchanged
    )


def _run_workers(plan: BuildPlan, count: Progress) -> tuple[int, Manifest]:
    """The workers, then the one manifest (:mod:`shardkit.write.build.join`), unless a
    crash came after it was written (the work is then deleted)."""
    target, stem, c = plan.target, plan.work_stem, plan.config
    done = target.read_manifest()
    info = build_info(done)
    if done is not None and info.get("config") == plan.fingerprint and info.get("complete"):
        target.drop_work(stem)
        return 0, done
    jobs = make_jobs(plan)
    written = 0
    part = {"index": c.part[0], "count": c.part[1]} if c.part else None
    if not target.begin_work(stem, plan.meta):  # True: every worker had finished
        if done is None:  # what verify and inspect find if this build is killed: unfinished
            started = creation_info(build={**plan.meta, "complete": False})
            target.write_manifest(Manifest([], c.checksum, {}, started, part, base=target.base))
        try:
            written, _ = run_workers(jobs, count)
        except BaseException as exc:  # the manifest left behind says why the build stopped
            why = {**plan.meta, "complete": False, "stopped": stop_reason(exc)}
            stopped = Manifest([], c.checksum, {}, creation_info(build=why), part, base=target.base)
            target.write_manifest(stopped)
            raise
    created = creation_info(build={**plan.meta, "complete": True})
    spec = JoinSpec(plan.shard_prefix, c.compress, c.checksum, created, part)
    return written, join_workers(target, stem, [j.target for j in jobs], spec)


def build(
    source: str | Sequence[str] | Callable[[Any], Iterable[Mapping[str, Any]]],
    inputs_or_out: Any,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Progress | bool = True,
    **options: Any,
) -> BuildResult:
    """Build shards and one manifest, from files or from a function of your own.

    ``build(["raw/"], "shards/", maxsize="512MB", workers=2)`` reads files as the CLI
    does. ``build(fn, inputs, "shards/", workers=4, maxsize="1GB")`` calls ``fn(input)``
    for every input and writes the samples (dicts: ``{"__key__": ..., "jpg": img, ...}``;
    a missing key becomes ``{input index:08d}/{n:06d}``) it yields, with the CLI's
    guarantees: the output for a given ``workers`` count is the same on every run,
    ``resume=True`` finishes a killed build, one manifest, a progress bar on a terminal.
    ``options`` are :class:`BuildConfig`'s; ``on_error="skip"`` skips an input whose
    ``fn`` raises and names it in ``manifest.errors.jsonl``.

    With ``workers > 1`` the workers are started with ``spawn``: ``fn`` must be defined
    at the top level of a module and a script that calls this must guard its entry point
    with ``if __name__ == "__main__":`` (the usual multiprocessing rule).
    """
    if callable(source):
        if out_dir is None:
            raise ConfigError("build(fn, inputs, out_dir): out_dir is missing")
        sources: list[Any] = list(inputs_or_out)
        config = BuildConfig(fn=source, **options)
        out: str | os.PathLike[str] = out_dir
    else:
        if out_dir is not None:
            raise ConfigError("build(sources, out_dir): give a function first for 3 arguments")
        sources = [source] if isinstance(source, str) else list(source)
        config = BuildConfig(**options)
        out = inputs_or_out
    plan = plan_build(sources, out, config)
    for note in plan.notes:
        log.warning("%s", note)
    if callable(progress) or progress is False:
        return run_build(plan, progress=progress or None)
    from tqdm import tqdm  # the Python API promises the CLI's bar (shown on a terminal only)

    unit = ("input", False) if config.fn is not None else ("B", True)
    bar = tqdm(total=plan.total_bytes, unit=unit[0], unit_scale=unit[1], desc="build", disable=None)
    with bar:
        return run_build(plan, progress=lambda _n, b: bar.update(b))
