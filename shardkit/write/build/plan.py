"""Planning a build: its inputs, parts and workers, and what the output already holds.

:func:`plan_build` reads the sources (or a build function's inputs) into units, splits
them, fingerprints the inputs and options, and checks an earlier build in the output
directory: every refusal names the way out (``--resume``, ``--overwrite``, another
``-o``) and what differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from shardkit.errors import ConfigError, WriterError
from shardkit.format.manifest.model import Manifest
from shardkit.units import parse_size
from shardkit.write.build.config import BuildConfig, BuildPlan, check_config, manifest_name
from shardkit.write.inputs.discover import DiscoverOptions, discover
from shardkit.write.inputs.sources import JSONL_EXTS, Unit
from shardkit.write.inputs.table_meta import TABLE_EXTS
from shardkit.write.writer.target import Target, build_info, store_failures
from shardkit.write.writer.where import open_target

__all__ = [
    "auto_workers",
    "check_unchanged",
    "clear_output",
    "output_lock",
    "part_range",
    "plan_build",
    "split_contiguous",
]

log = logging.getLogger(__name__)


_AUTO_BYTES_PER_WORKER = 256 << 20  # a worker costs ~1 s to spawn: worth it past ~256 MB


def auto_workers(units: Sequence[Unit]) -> int:
    """The worker count for ``workers=None``: one per 256 MB of input, at most the CPUs."""
    if not units or units[0].kind == "call":
        return 1
    total = sum(u.size for u in units)
    return max(1, min(os.cpu_count() or 1, total // _AUTO_BYTES_PER_WORKER))


def _fn_name(fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _options(c: BuildConfig, workers: int) -> dict[str, Any]:
    """The options a build's output depends on, as JSON (what a resume must repeat)."""
    plain = dataclasses.replace(c, resume=False, overwrite=False, workers=workers, fn=None)
    opts = dataclasses.asdict(plain)
    opts["maxsize"] = parse_size(c.maxsize)
    opts["fn"] = _fn_name(c.fn)
    if opts["tar_policy"] == "strict":  # the default: builds made before it keep their print
        del opts["tar_policy"]
    loaded: dict[str, Any] = json.loads(json.dumps(opts, sort_keys=True))
    return loaded


def _fingerprint(units: Sequence[Unit], options: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    for u in units:
        path = u.path if u.kind == "call" else os.path.abspath(u.path)
        h.update(json.dumps([u.kind, path, u.size, u.name, u.members, u.group]).encode())
    h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _differs(old: Mapping[str, Any], plan: BuildPlan) -> str:
    """What makes an earlier build (its ``created.build``) differ from ``plan``."""
    before = old.get("options")
    if not isinstance(before, dict):
        return "it does not record how it was built"
    changed = [
        f"{k} {before.get(k)!r} -> {plan.options.get(k)!r}"
        for k in sorted(set(before) | set(plan.options))
        if before.get(k) != plan.options.get(k)
    ]
    if changed:
        return "options differ: " + ", ".join(changed)
    inputs = old.get("inputs") or {}
    if inputs:
        return (
            f"the inputs differ: {inputs.get('units')} inputs of {inputs.get('bytes')} bytes "
            f"then, {len(plan.units)} of {plan.total_bytes} now"
        )
    return "the inputs or options differ"


def _previous(plan: BuildPlan) -> Manifest | None:
    """Check what the output holds against this plan; the finished manifest, if any.

    Every refusal says which way out applies: ``--resume`` (same inputs and options, not
    finished), ``--overwrite`` (start over) or another output directory.
    """
    path, c, target, stem = plan.manifest_path, plan.config, plan.target, plan.work_stem
    if c.overwrite:
        return None
    work = target.work_name(stem)
    old = target.work_state(stem)
    busy = target.has_work(stem)
    if old is not None:
        if old.get("config") != plan.fingerprint:
            raise ConfigError(
                f"{work} holds an interrupted build of other inputs or options "
                f"({_differs(old, plan)}): pass --overwrite to start over, or use another -o"
            )
        if not c.resume:
            raise ConfigError(
                f"{work} holds an interrupted build of these inputs: pass --resume to finish "
                "it, or --overwrite to start over"
            )
    elif busy and not c.resume:
        raise ConfigError(f"{work} holds an interrupted build: pass --resume or --overwrite")
    m = target.read_manifest()
    if m is None:
        return None
    info = build_info(m)
    same = info.get("config") == plan.fingerprint
    if not same:
        raise ConfigError(
            f"{path} was built from other inputs or options ({_differs(info, plan)}): "
            "pass --overwrite to replace it, or use another -o"
            + (" (--resume needs the same inputs and options)" if c.resume else "")
        )
    if not c.resume:
        if info.get("complete") and not busy:
            return m  # nothing to do: run_build reports it as it is
        raise ConfigError(
            f"{path} is an unfinished build of these inputs: pass --resume to finish it, "
            "or --overwrite to start over"
        )
    return m if info.get("complete") and not busy else None


def _check_record_options(c: BuildConfig, units: Sequence[Unit]) -> None:
    """``--field``/``--key-field`` never silently ignored: a folder read as a file tree, or
    sources with no records at all, are an error naming the way out."""
    if not c.fields and c.key_field is None:
        return
    flag = "--field" if c.fields else "--key-field"
    tree = next((u for u in units if u.kind == "files"), None)
    if tree is not None:
        records = (*JSONL_EXTS, *TABLE_EXTS)
        others = (rel for u in units for _, rel in u.members if not rel.endswith(records))
        member = next(others, tree.name)
        raise ConfigError(
            f"{flag} applies to JSONL and Parquet records, but {tree.path} is read as a file "
            f"tree (it holds files of other kinds, e.g. {member}): give the record files, "
            "--exclude the others, or pass --source-type jsonl"
        )
    if not any(u.kind in ("jsonl", "table") for u in units):
        raise ConfigError(f"{flag} applies to JSONL and Parquet records; these sources have none")


def _call_units(inputs: Iterable[Any]) -> list[Unit]:
    return [Unit("call", repr(x)[:200], 1, f"{i:08d}", payload=x) for i, x in enumerate(inputs)]


def _workers_for(c: BuildConfig, units: Sequence[Unit], target: Target) -> int:
    """The worker count: given, the one an interrupted build used, or chosen by size."""
    if c.workers is not None:
        return max(1, min(c.workers, len(units)))
    if c.resume:
        for meta in _earlier_meta(c, target):
            w = (meta.get("options") or {}).get("workers")
            if isinstance(w, int) and w >= 1:
                return w
    return max(1, min(auto_workers(units), len(units)))


def _earlier_meta(c: BuildConfig, target: Target) -> list[dict[str, Any]]:
    """The ``created.build`` facts an earlier build of this output left (work, manifest)."""
    found: list[dict[str, Any]] = []
    state = target.work_state(BuildPlan(target, c, (), (), "").work_stem)
    if state is not None:
        found.append(state)
    m = target.read_manifest()
    if m is not None:
        found.append(build_info(m))
    return found


def plan_build(
    sources: Sequence[Any], out_dir: str | os.PathLike[str], config: BuildConfig | None = None
) -> BuildPlan:
    """Find the inputs, split them into parts and workers, check the output directory.

    ``sources`` are paths and patterns, or with ``config.fn`` the inputs of the build
    function. Raises :class:`ConfigError` for bad options, missing sources or an output
    directory that holds another build (or an unfinished one without ``resume`` or
    ``overwrite``), saying which way out applies.
    """
    c = config or BuildConfig()
    check_config(c)
    target = open_target(out_dir, manifest_name(c.part))  # the one choice: folder or store
    out = target.base
    if not sources:
        raise ConfigError("no sources given" if c.fn is None else "no inputs given")
    notes: list[str] = []
    if c.fn is not None:
        units = _call_units(sources)
    else:
        d = DiscoverOptions(c.source_type, [out], c.tree, c.image, c.on_error, notes)
        units = discover(sources, options=d)
    if not units:
        raise ConfigError(f"found no input in {', '.join(map(str, sources))}")
    _check_record_options(c, units)
    if c.part is not None:
        r = part_range([u.size for u in units], c.part[1], c.part[0])
        units = units[r.start : r.stop]
    with store_failures(out):
        workers = _workers_for(c, units, target)
    if c.workers is None and workers > 1:
        notes.append(
            f"using {workers} workers for {sum(u.size for u in units) / 1e6:,.0f} MB of input "
            "(--workers N fixes the count; the shards are the same for a given count)"
        )
    if workers > 1 and c.fn is not None:
        _check_picklable(c.fn)
    groups = tuple(split_contiguous([u.size for u in units], workers))
    options = _options(c, workers)
    plan = BuildPlan(
        target, c, tuple(units), groups, _fingerprint(units, options), None, options, tuple(notes)
    )
    # another build writing here now: refused at once, named (a missing folder has none;
    # a store's lock objects are taken when the build runs)
    lock = output_lock(plan) if os.path.isdir(out) else contextlib.nullcontext()
    with store_failures(out), lock:
        if c.overwrite:
            _check_overwrite(plan)
        done = _previous(plan)
    return dataclasses.replace(plan, done=done) if done is not None else plan


def output_lock(plan: BuildPlan) -> contextlib.AbstractContextManager[Any]:
    """The lock a build holds on its output: its manifest name and its shard prefix (in an
    object store, lock objects: :mod:`shardkit.write.writer.object_lock`)."""
    lock = plan.target.lock((plan.manifest_name, f"{plan.shard_prefix}-shards"))
    return lock if lock is not None else contextlib.nullcontext()


def check_unchanged(plan: BuildPlan) -> None:
    """Under the output lock, before writing: the output is still what ``plan`` saw (no
    other build finished or started here in between); else a WriterError."""
    if plan.config.overwrite:
        return
    try:
        done = _previous(plan)
    except ConfigError as exc:
        raise WriterError(f"the output changed since this build was planned: {exc}") from None
    if (done is None) != (plan.done is None):
        raise WriterError(
            f"{plan.out_dir} changed since this build was planned (another build wrote it): "
            "run the build again"
        )


def _check_picklable(fn: Callable[..., Any]) -> None:
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"the build function {_fn_name(fn)} cannot go to worker processes ({exc}): "
            "define it at the top level of a module, or use workers=1"
        ) from None


def _check_overwrite(plan: BuildPlan) -> None:
    """Refuse an ``overwrite`` that would delete one of the build's own inputs."""
    doomed = set(plan.target.doomed(plan.shard_prefix))
    for u in plan.units:
        paths = [os.path.join(u.path, rel) for _, rel in u.members] if u.members else [u.path]
        hit = next((p for p in paths if os.path.abspath(p) in doomed), None)
        if u.kind != "call" and hit is not None:
            raise ConfigError(
                f"--overwrite would delete the input {hit}: write the new shards to another -o "
                "(or another --prefix)"
            )


def clear_output(plan: BuildPlan) -> None:
    """``overwrite``: delete what an earlier build of this prefix and part left behind (in
    a store, the old manifest first: no manifest ever lists a deleted object)."""
    removed = plan.target.clear(plan.shard_prefix, plan.work_stem)
    log.info("overwrite: removed %d files of the earlier build in %s", removed, plan.out_dir)


def _group_of(acc: int, size: int, i: int, count: int, total: int, n: int) -> int:
    """The group item ``i`` (of ``count``, starting at ``acc`` of ``total`` bytes) falls in."""
    if total > 0:
        return min(n - 1, (2 * acc + size) * n // (2 * total))
    return min(n - 1, i * n // count)


def part_range(sizes: Sequence[int], n: int, i: int) -> range:
    """Group ``i`` of :func:`split_contiguous` ``(sizes, n)``, in O(len(sizes)) time and
    memory whatever ``n`` is (``--part 0/1000000000`` must not allocate n bounds)."""
    if not 0 <= i < n:
        raise ConfigError(f"part must be I/N with 0 <= I < N, got {i}/{n}")
    total, acc = sum(sizes), 0
    start = stop = None
    for j, size in enumerate(sizes):
        g = _group_of(acc, size, j, len(sizes), total, n)
        acc += size
        if g == i:
            start = j if start is None else start
            stop = j + 1
        elif g > i:
            break
    if start is None or stop is None:
        return range(0, 0)
    return range(start, stop)


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
        group = _group_of(acc, size, i, len(sizes), total, n)
        bounds[group + 1] = i + 1
        acc += size
    for g in range(1, n + 1):
        bounds[g] = max(bounds[g], bounds[g - 1])
    return [range(bounds[g], bounds[g + 1]) for g in range(n)]
