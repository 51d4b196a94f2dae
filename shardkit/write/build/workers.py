"""The processes of a build: writer jobs, parallel workers, and the final renames.

A :class:`Job` writes a contiguous run of input units into shards with one
:class:`ShardWriter`. With one job it runs in the calling process and writes the final
shards and manifest directly. With several, each runs in a worker process (``spawn``:
safe with threads, the same on every platform) writing into its own directory under a
hidden work directory; :func:`finalize` then renames every shard into one contiguous
sequence and writes one manifest. Workers stop when the main process dies (they watch
their parent pid), so a killed build leaves no writer behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardkit.durable import atomic_write
from shardkit.errors import ShardkitError, WriterError
from shardkit.format.layout import index_name
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest, ShardEntry, creation_info
from shardkit.io.stores import is_object_url
from shardkit.units import parse_size
from shardkit.write.build.targets import (
    ErrorLog,
    ObjectErrorLog,
    ObjectPlace,
    build_info,
    errors_name,
    place_of,
    read_manifest,
    store_failures,
)
from shardkit.write.inputs.records import read_units
from shardkit.write.inputs.sources import BadRecord, SourceOptions, Unit
from shardkit.write.writer import ShardWriter, WriterOptions, shard_name
from shardkit.write.writer.outputs import ObjectOutput

if TYPE_CHECKING:
    from shardkit.write.build.config import BuildConfig, BuildPlan

__all__ = [
    "Job",
    "Progress",
    "Reporter",
    "finalize",
    "make_jobs",
    "run_workers",
    "write_job",
]

Progress = Callable[[int, int], object]
"""``progress(samples, input_bytes)``: increments since the last call, in the caller's process."""


class _ParentGone(BaseException):
    """The build's main process died: a worker stops (its open shard is discarded)."""


class Reporter:
    """Batches progress so the callback (or the queue to the main process) runs ~10x/s."""

    def __init__(self, emit: Progress, *, parent: int | None = None) -> None:
        self.emit = emit
        self.parent = parent
        self.samples = 0
        self.nbytes = 0
        self.last = time.monotonic()

    def add(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if time.monotonic() - self.last >= 0.1:
            self.flush()

    def flush(self) -> None:
        if self.parent is not None and os.getppid() != self.parent:
            raise _ParentGone
        if self.samples or self.nbytes:
            self.emit(self.samples, self.nbytes)
            self.samples = self.nbytes = 0
        self.last = time.monotonic()


@dataclass(frozen=True)
class Job:
    """One writer's work: its units and where its shards go."""

    units: tuple[Unit, ...]
    out_dir: str
    manifest: str
    prefix: str
    config: BuildConfig
    fingerprint: str
    part: tuple[int, int] | None = None
    index: int = 0
    parent: int | None = None
    opts: SourceOptions = field(default_factory=SourceOptions)
    meta: dict[str, Any] = field(default_factory=dict)  # the build's facts for its manifest


def _finished(job: Job) -> Manifest | None:
    m = read_manifest(job.out_dir, job.manifest)
    if m is None:
        return None
    info = build_info(m)
    return m if info.get("config") == job.fingerprint and info.get("complete") else None


def _error_log(job: Job) -> ErrorLog:
    """The job's report of skipped records beside its manifest (locally or in the store)."""
    name = errors_name(job.manifest)
    if is_object_url(job.out_dir):
        return ObjectErrorLog(ObjectOutput(job.out_dir, job.manifest), name)
    os.makedirs(job.out_dir, exist_ok=True)
    return ErrorLog(os.path.join(job.out_dir, name))


def _stop_reason(exc: BaseException) -> str:
    """What a build's manifest says about why it stopped (``created.build.stopped``)."""
    if isinstance(exc, _ParentGone):
        return "the build's main process died"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, ShardkitError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def write_job(job: Job, report: Reporter) -> tuple[int, int]:
    """Write the job's samples into shards; return (samples written, samples kept)."""
    c = job.config
    done = _finished(job) if c.resume else None
    if done is not None:
        report.add(0, sum(u.size for u in job.units))
        return 0, done.total_samples
    written = 0
    errors = _error_log(job)
    opts = WriterOptions(
        job.prefix,
        c.maxsize,
        c.maxcount,
        c.checksum,
        c.compress,
        image_quality=c.image.quality if c.image is not None else 90,
    )
    with ShardWriter(job.out_dir, opts, manifest=job.manifest, resume=c.resume, part=job.part) as w:
        info: dict[str, Any] = {**job.meta, "config": job.fingerprint, "complete": False}
        w.manifest.created["build"] = info
        try:
            for sample, nbytes in read_units(job.units, job.opts, skip=w.resumed_samples):
                if isinstance(sample, BadRecord):
                    errors.add(sample)
                    report.add(0, nbytes)
                elif sample is not None:
                    w.write(sample)
                    written += 1
                    report.add(1, nbytes)
                else:
                    report.add(0, nbytes)
        except BaseException as exc:
            info["stopped"] = _stop_reason(exc)  # the manifest the writer leaves says why
            raise
        finally:
            errors.close()
            if errors.count:
                info["skipped_records"] = errors.count
                info["errors"] = os.path.basename(errors.path)
        info["complete"] = True
    report.flush()
    return written, w.resumed_samples


def _worker_main(job: Job, q: Any) -> None:
    """Entry point of a worker process: messages go to the main process through ``q``."""
    report = Reporter(lambda s, b: q.put(("progress", job.index, s, b)), parent=job.parent)
    try:
        with store_failures(job.out_dir):
            written, kept = write_job(job, report)
        q.put(("done", job.index, written, kept))
    except (_ParentGone, KeyboardInterrupt):
        return
    except ShardkitError as exc:
        q.put(("error", job.index, _portable(exc)))
    except Exception:  # noqa: BLE001 - a bug: its traceback goes whole to the main process
        q.put(("crash", job.index, traceback.format_exc()))


def _portable(exc: ShardkitError) -> ShardkitError:
    """``exc`` if it survives pickling with its message intact, else a WriterError saying it."""
    try:
        back = pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes, same process
    except (pickle.PicklingError, TypeError, AttributeError):
        back = None
    return (
        back if isinstance(back, ShardkitError) and str(back) == str(exc) else WriterError(str(exc))
    )


def make_jobs(plan: BuildPlan) -> list[Job]:
    """One job writing the final shards directly, or one per worker into the work dir."""
    c = plan.config
    opts = SourceOptions(
        c.fields,
        c.key_field,
        c.on_error,
        c.image,
        c.fn,
        parse_size(c.max_member),
        parse_size(c.max_record),
        c.check_images,
        c.tar_policy,
    )
    n = range(len(plan.groups))
    common: dict[str, Any] = {
        "config": c,
        "fingerprint": plan.fingerprint,
        "opts": opts,
        "meta": plan.meta,
    }
    if len(plan.groups) == 1:
        return [
            Job(
                plan.units,
                plan.out_dir,
                plan.manifest_name,
                plan.shard_prefix,
                part=c.part,
                **common,
            )
        ]
    place = place_of(plan)
    if isinstance(place, ObjectPlace):  # straight into the store under names of their own
        where = [(plan.out_dir, place.worker_manifest(i), place.worker_prefix(i)) for i in n]
    else:
        where = [(os.path.join(plan.work_dir, f"w{i:04d}"), "manifest.json", c.prefix) for i in n]
    return [
        Job(plan.units[g.start : g.stop], *where[i], index=i, parent=os.getpid(), **common)
        for i, g in enumerate(plan.groups)
        if len(g)
    ]


def _collect(procs: dict[int, Any], q: Any, progress: Progress | None) -> tuple[int, int]:
    """Wait for every worker; pass progress on; raise the first worker's error."""
    pending = set(procs)
    quiet: set[int] = set()  # ended with code 0 but no word yet: one more empty poll decides
    written = kept = 0
    while pending:
        try:
            msg = q.get(timeout=0.2)
        except queue_mod.Empty:
            for i in sorted(pending):
                code = procs[i].exitcode
                if code is not None and (code != 0 or i in quiet):
                    raise WriterError(f"build worker {i} died (exit code {code})") from None
                if code == 0:
                    quiet.add(i)
            continue
        kind, i = msg[0], msg[1]
        if kind == "progress":
            if progress is not None:
                progress(msg[2], msg[3])
        elif kind == "done":
            written += msg[2]
            kept += msg[3]
            pending.discard(i)
        elif kind == "error":
            raise msg[2]
        else:
            raise RuntimeError(f"build worker {i} failed:\n{msg[2]}")
    return written, kept


def run_workers(plan: BuildPlan, progress: Progress | None) -> tuple[int, int]:
    """Run one process per job; (samples written, samples kept from an earlier run)."""
    if place_of(plan).begin():
        return 0, 0  # every worker had finished; only the renames were left
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = {}
    for job in make_jobs(plan):
        p = ctx.Process(target=_worker_main, args=(job, q), name=f"shardkit-build-{job.index}")
        procs[job.index] = p
    try:
        for p in procs.values():
            p.start()
        return _collect(procs, q, progress)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.terminate()
        for p in procs.values():
            p.join()
        q.close()


def _gather(plan: BuildPlan) -> tuple[Manifest, list[tuple[str, str]]]:
    """The global manifest of the workers' shards and the renames that make it true."""
    c = plan.config
    shards: list[ShardEntry] = []
    moves: list[tuple[str, str]] = []
    fields: dict[str, dict[str, int]] = {}
    skipped = 0
    for i in range(len(plan.groups)):
        wdir = os.path.join(plan.work_dir, f"w{i:04d}")
        path = os.path.join(wdir, "manifest.json")
        if not os.path.exists(path):
            continue
        m = Manifest.load(path)
        skipped += int(build_info(m).get("skipped_records", 0))
        for s in m.shards:
            name = shard_name(plan.shard_prefix, len(shards), c.compress)
            moves.append((os.path.join(wdir, s.url), os.path.join(plan.out_dir, name)))
            index = None
            if s.index:
                index = index_name(name)
                moves.append((os.path.join(wdir, s.index), os.path.join(plan.out_dir, index)))
            shards.append(dataclasses.replace(s, url=name, index=index))
        for fname, st in m.fields.items():
            acc = fields.setdefault(fname, {"count": 0, "bytes": 0})
            acc["count"] += st["count"]
            acc["bytes"] += st["bytes"]
    part = {"index": c.part[0], "count": c.part[1]} if c.part else None
    info: dict[str, Any] = {**plan.meta, "complete": True}
    if skipped:
        info["skipped_records"] = skipped
        info["errors"] = errors_name(plan.manifest_name)
    created = creation_info(build=info)
    manifest = Manifest(shards, c.checksum, fields, created, part, base=plan.out_dir)
    return manifest, moves


def _join_error_logs(plan: BuildPlan) -> None:
    """The workers' skipped-record reports, in worker order, as one report beside the manifest."""
    logs = [
        os.path.join(plan.work_dir, f"w{i:04d}", errors_name("manifest.json"))
        for i in range(len(plan.groups))
    ]
    logs = [p for p in logs if os.path.exists(p)]
    out = os.path.join(plan.out_dir, errors_name(plan.manifest_name))
    if not logs:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
        return

    def chunks() -> Any:
        for p in logs:
            with open(p, "rb") as f:
                yield f.read()

    atomic_write(out, chunks())


def finalize(plan: BuildPlan) -> Manifest:
    """Rename the workers' shards into one sequence, write the manifest, drop the work dir.

    The renames are planned into ``finalize.json`` first, so a crash half-way through is
    finished by ``--resume`` (a rename whose source is gone was already done).
    """
    fin = os.path.join(plan.work_dir, "finalize.json")
    if os.path.exists(fin):
        with open(fin, encoding="utf-8") as f:
            saved = json.load(f)
        manifest = Manifest.from_dict(saved["manifest"])
        moves = [tuple(m) for m in saved["moves"]]
    else:
        manifest, moves = _gather(plan)
        doc = {"manifest": manifest.to_dict(), "moves": moves}
        atomic_write(fin, json.dumps(doc).encode())
    for src, dst in moves:
        if os.path.exists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
    _join_error_logs(plan)
    manifest.base = plan.out_dir
    save_manifest(manifest, plan.manifest_path)
    shutil.rmtree(plan.work_dir)
    return manifest
