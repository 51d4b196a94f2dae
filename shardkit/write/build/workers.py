"""The processes of a build: writer jobs, parallel workers, and the final renames.

A :class:`Job` writes a contiguous run of input units into shards with one
:class:`ShardWriter`. With one job it runs in the calling process and writes the final
shards and manifest directly. With several, each runs in a worker process (``spawn``:
safe with threads, the same on every platform) writing into its own place
(:meth:`Target.worker`); :mod:`shardkit.write.build.join` then writes one manifest over
their shards. Workers stop when the main process dies (they watch
their parent pid), so a killed build leaves no writer behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardkit.errors import ShardkitError, WriterError
from shardkit.format.manifest.model import Manifest
from shardkit.units import parse_size
from shardkit.write.inputs.records import read_units
from shardkit.write.inputs.sources import BadRecord, Located, SourceError, SourceOptions, Unit
from shardkit.write.writer import ShardWriter
from shardkit.write.writer.target import ErrorLog, Target, build_info, errors_name, store_failures

if TYPE_CHECKING:
    from shardkit.write.build.config import BuildConfig, BuildPlan

__all__ = [
    "Job",
    "Progress",
    "Reporter",
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
    target: Target
    prefix: str
    config: BuildConfig
    fingerprint: str
    part: tuple[int, int] | None = None
    index: int = 0
    parent: int | None = None
    opts: SourceOptions = field(default_factory=SourceOptions)
    meta: dict[str, Any] = field(default_factory=dict)  # the build's facts for its manifest


def _finished(job: Job) -> Manifest | None:
    m = job.target.read_manifest()
    info = build_info(m)
    return m if info.get("config") == job.fingerprint and info.get("complete") else None


def stop_reason(exc: BaseException) -> str:
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
    errors = job.target.error_log()
    with ShardWriter(
        job.target,
        resume=c.resume,
        part=job.part,
        prefix=job.prefix,
        maxsize=c.maxsize,
        maxcount=c.maxcount,
        checksum=c.checksum,
        compress=c.compress,
        image_quality=c.image.quality if c.image is not None else 90,
    ) as w:
        info: dict[str, Any] = {**job.meta, "config": job.fingerprint, "complete": False}
        w.manifest.created["build"] = info
        try:
            for sample, nbytes in read_units(job.units, job.opts, skip=w.resumed_samples):
                if isinstance(sample, BadRecord):
                    errors.add(sample)
                    report.add(0, nbytes)
                elif sample is not None:
                    _write(w, sample)
                    written += 1
                    report.add(1, nbytes)
                else:
                    report.add(0, nbytes)
            # one job alone (a worker's share may hold only bad records: the join decides)
            if errors.count and not written and not w.resumed_samples and job.parent is None:
                raise SourceError(all_skipped(errors, job.target.manifest_name))
        except BaseException as exc:
            info["stopped"] = stop_reason(exc)  # the manifest the writer leaves says why
            raise
        finally:
            errors.close()
            if errors.count:
                info["skipped_records"] = errors.count
                info["errors"] = errors_name(job.target.manifest_name)
        info["complete"] = True
    report.flush()
    return written, w.resumed_samples


def _write(w: ShardWriter, sample: dict[str, Any]) -> None:
    """``w.write(sample)``; what the writer refuses (a key twice in a shard) names where
    the sample was read (its file and line or row)."""
    try:
        w.write(sample)
    except WriterError as exc:
        if isinstance(sample, Located):
            raise WriterError(f"{sample.where}: {exc}") from exc
        raise


def all_skipped(errors: ErrorLog, manifest: str) -> str:
    """What a build says when ``on_error="skip"`` left out every record: an empty set is
    no success (a mistyped ``--field`` or ``--key-field`` does that)."""
    first = errors.first
    said = ""
    if first is not None:
        said = f" The first: {first.source} {first.position} {first.number}: {first.reason}."
    return (
        f"every record was skipped ({errors.count}) and none written (a mistyped --field or "
        f"--key-field does that).{said} Each is named in {errors_name(manifest)}"
    )


def _worker_main(job: Job, q: Any) -> None:
    """Entry point of a worker process: messages go to the main process through ``q``."""
    report = Reporter(lambda s, b: q.put(("progress", job.index, s, b)), parent=job.parent)
    try:
        with store_failures(job.target.base):
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
        return [Job(plan.units, plan.target, plan.shard_prefix, part=c.part, **common)]
    where = [plan.target.worker(plan.work_stem, f"w{i:04d}", plan.shard_prefix) for i in n]
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


def run_workers(jobs: list[Job], progress: Progress | None) -> tuple[int, int]:
    """Run one process per job; (samples written, samples kept from an earlier run)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = {}
    for job in jobs:
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
