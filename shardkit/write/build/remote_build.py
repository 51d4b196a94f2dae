"""The last step of a parallel build into an object store, and ``overwrite`` there.

With ``workers > 1`` each worker streams its shards straight into the store under names of
its own (``{prefix}-wNNNN-NNNNNN.tar``, see :mod:`shardkit.write.build.targets`) and leaves its
own manifest; :func:`finalize_remote` then writes the build's one manifest over them, in
worker order, with their ETag records and one report of skipped records, and deletes the
work objects, the build's state last. Nothing is copied or renamed: an object store has no
rename, and a copy would cost what the upload did. A crash at any point leaves either the
workers' manifests (``--resume`` finishes: the workers find their work done) or the final
manifest, which lists only shards the workers' manifests listed: whole objects.

:func:`clear_remote` (``--overwrite``) deletes the old data set's manifest first (so no
manifest ever lists a deleted object), then the shards and indexes it listed, this
prefix's shards, its ETag record, journal, report and work objects.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from shardkit.errors import WriterError
from shardkit.format.manifest.model import Manifest, ShardEntry, creation_info
from shardkit.write.build.targets import ObjectPlace, build_info, errors_name, read_manifest
from shardkit.write.writer.outputs import ObjectOutput

if TYPE_CHECKING:
    from shardkit.write.build.config import BuildPlan

__all__ = ["clear_remote", "drop_work", "finalize_remote", "finished_remote"]

log = logging.getLogger(__name__)


def finalize_remote(plan: BuildPlan) -> Manifest:
    """One manifest over the workers' shards in the store, written last (module docstring)."""
    place = ObjectPlace(plan)
    final = place.out
    shards: list[ShardEntry] = []
    fields: dict[str, dict[str, int]] = {}
    skipped = 0
    reports: list[str] = []
    for i, g in enumerate(plan.groups):
        if not len(g):
            continue
        name = place.worker_manifest(i)
        m = read_manifest(plan.out_dir, name)
        info = build_info(m) if m is not None else {}
        if m is None or not info.get("complete"):
            raise WriterError(f"{plan.out_dir}: build worker {i} left no whole manifest ({name})")
        worker = ObjectOutput(plan.out_dir, name)
        worker.existing()  # its ETag record
        final.tags.update(worker.tags)
        shards.extend(m.shards)
        if info.get("skipped_records"):
            skipped += int(info["skipped_records"])
            reports.append(worker.key(errors_name(name)))
        for fname, st in m.fields.items():
            acc = fields.setdefault(fname, {"count": 0, "bytes": 0})
            acc["count"] += st["count"]
            acc["bytes"] += st["bytes"]
    c = plan.config
    info_out: dict[str, Any] = {**plan.meta, "complete": True}
    report = final.key(errors_name(plan.manifest_name))
    final.store.delete(report)
    if skipped:
        _join_reports(place, reports, report)
        info_out["skipped_records"] = skipped
        info_out["errors"] = errors_name(plan.manifest_name)
    part = {"index": c.part[0], "count": c.part[1]} if c.part else None
    manifest = Manifest(shards, c.checksum, fields, creation_info(build=info_out), part)
    manifest.base = final.base
    final.write_manifest(manifest)
    drop_work(place)
    return manifest


def finished_remote(plan: BuildPlan) -> Manifest | None:
    """The finished manifest of this build if a crash came after it was written, while the
    work objects were being deleted: the deletion is finished (no worker writes again)."""
    place = ObjectPlace(plan)
    m = place.manifest()
    info = build_info(m) if m is not None else {}
    if m is None or info.get("config") != plan.fingerprint or not info.get("complete"):
        return None
    drop_work(place)
    return m


def _join_reports(place: ObjectPlace, keys: list[str], target: str) -> None:
    """The workers' reports of skipped records, in worker order, as one object."""
    up = place.out.store.upload(target)
    try:
        for key in keys:
            up.write(place.out.store.get(key) or b"")
        up.complete()
    finally:
        up.abort()


def drop_work(place: ObjectPlace) -> None:
    """Delete the work objects of a parallel build, its state last."""
    for key in place.work_keys():
        place.out.store.delete(key)
    place.out.store.delete(place.state_key)


def clear_remote(plan: BuildPlan) -> None:
    """``overwrite`` in an object store (module docstring); the manifest goes first."""
    place = ObjectPlace(plan)
    removed = place.out.remove_existing(plan.shard_prefix, worker_names=True)
    drop_work(place)
    log.info("overwrite: removed %d objects of the earlier build in %s", removed, place.out.base)
