"""``shardkit build`` as a library: sources in, shards and one checksum manifest out.

:func:`plan_build` reads the sources into a fixed list of input units (see
:mod:`shardkit.write.inputs.sources`) and checks the options and what the output directory already
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
  inputs or options is refused, and whether the build finished (a manifest of a build
  that did not finish fails ``verify`` and is refused by readers). ``overwrite=True``
  starts over.
- One build per output at a time: a build locks its manifest name and shard prefix in
  the output directory (:mod:`shardkit.write.writer.lock`); a second one fails at once naming
  the first's pid and host.
- ``on_error="skip"`` leaves bad records out and names them in
  ``manifest.errors.jsonl``; the default stops at the first.
- ``build(fn, inputs, out)`` builds from a function of your own (see :func:`build`).
- The output may be an object-store prefix (``s3://bucket/set/``, ``gs://``, ``az://``):
  shards are streamed into it with no local copy, workers write under names of their own
  and the manifest goes last; the build's state, lock and report are objects there
  (:mod:`shardkit.write.build.targets`, :mod:`shardkit.write.build.remote_build`,
  :mod:`shardkit.write.writer.object_lock`).

The options and plan are in :mod:`shardkit.write.build.config`, planning in
:mod:`shardkit.write.build.plan`, the processes in :mod:`shardkit.write.build.workers`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from shardkit.durable import atomic_write
from shardkit.errors import ConfigError, ManifestError, ShardkitError, WriterError
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest, creation_info
from shardkit.io.stores import is_object_url
from shardkit.write.build.config import BuildConfig, BuildPlan, BuildResult
from shardkit.write.build.plan import (
    check_unchanged,
    clear_output,
    output_lock,
    plan_build,
)
from shardkit.write.build.remote_build import finalize_remote, finished_remote
from shardkit.write.build.targets import build_info, errors_name, place_of, store_failures
from shardkit.write.build.workers import (
    Progress,
    Reporter,
    finalize,
    make_jobs,
    run_workers,
    write_job,
)

__all__ = ["build", "merge_parts", "run_build"]

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
        found = place_of(plan).manifest()
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
    """The workers, then the one manifest (renames locally; over the workers' own shards in
    an object store, unless a crash came after it was written)."""
    if not is_object_url(plan.out_dir):
        written, _ = run_workers(plan, count)
        return written, finalize(plan)
    finished = finished_remote(plan)
    if finished is not None:
        return 0, finished
    written, _ = run_workers(plan, count)
    return written, finalize_remote(plan)


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
        gaps = (i for i in range(count) if i not in have)  # lazily: count may be 10**9
        missing = ", ".join(str(i) for i in itertools.islice(gaps, 10))
        more = ", ..." if count - len(have) > 10 else ""
        raise ManifestError(f"only {incomplete} given: part {missing}{more} missing")
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
        same = url == s.url and index == s.index
        shards.append(s if same else dataclasses.replace(s, url=url, index=index))
    merged.shards, merged.base = shards, base
    merged.created = creation_info(merged_parts=len(parts))
    if incomplete:
        merged.created["incomplete"] = incomplete
    skipped = _merge_error_logs(paths, parts, out)
    if skipped:
        report = os.path.basename(errors_name(out))
        merged.created["build"] = {"complete": True, "skipped_records": skipped, "errors": report}
    save_manifest(merged, out)
    return merged


def _merge_error_logs(
    paths: Sequence[str | os.PathLike[str]], parts: Sequence[Manifest], out: str
) -> int:
    """The parts' skipped-record reports joined, in part order, beside the merged manifest;
    the number of records they name (what the parts' manifests count)."""
    logs: list[tuple[int, str]] = []
    skipped = 0
    for path, m in zip(paths, parts, strict=True):
        info = build_info(m)
        count = int(info.get("skipped_records") or 0)
        if not count:
            continue
        report = os.path.join(os.path.dirname(os.path.abspath(path)), str(info.get("errors")))
        if not os.path.exists(report):
            raise ManifestError(
                f"this part skipped {count} records but its report {report} is missing",
                path=str(path),
            )
        skipped += count
        logs.append(((m.part or {}).get("index", 0), report))
    target = errors_name(out)
    if not logs:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        return 0

    def chunks() -> Iterator[bytes]:
        for _, report in sorted(logs):
            with open(report, "rb") as f:
                yield from iter(lambda: f.read(1 << 20), b"")

    atomic_write(target, chunks())
    return skipped
