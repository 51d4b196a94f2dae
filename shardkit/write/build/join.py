"""One manifest from the manifests of the writers that wrote a set in parallel: the join of a
parallel build (in a folder or a store) and of the Ray sink, and the parts' merge.

Each worker wrote whole shards and a manifest of its own into its own place
(:meth:`Target.worker`). :func:`join_workers` lists their shards in worker order, as the
target places them (renamed into one sequence in a folder, left where they are in a store),
adds up their fields and skipped records, joins their reports into one beside the manifest,
writes the manifest last and deletes the work. A worker whose manifest is missing or not
whole stops the join; a crash during it leaves the work, and the join runs again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import WriterError
from shardkit.format.manifest.model import Manifest, ShardEntry, add_fields
from shardkit.write.writer.options import shard_name
from shardkit.write.writer.target import Target, build_info, errors_name

__all__ = ["JoinSpec", "join_workers"]


@dataclass(frozen=True)
class JoinSpec:
    """What the joined manifest is: its shards' names (``prefix``, ``compress``), checksum
    algorithm, ``created`` block (a build's ``build`` facts in it gain the skipped count)
    and ``part``."""

    prefix: str
    compress: str | None
    checksum: str
    created: dict[str, Any]
    part: dict[str, int] | None = None


def _name(spec: JoinSpec, first: int, i: int) -> str:
    return shard_name(spec.prefix, first + i, spec.compress)


def _gather(
    target: Target, workers: Sequence[Target], spec: JoinSpec
) -> tuple[Manifest, list[tuple[str, str]]]:
    shards: list[ShardEntry] = []
    moves: list[tuple[str, str]] = []
    fields: dict[str, dict[str, int]] = {}
    skipped = 0
    for w in workers:
        m, journal = w.existing()
        info = build_info(m)
        if m is None or journal or (info and not info.get("complete")):
            raise WriterError(f"{target.base}: a worker left no whole manifest ({w.manifest_path})")
        named = functools.partial(_name, spec, len(shards))
        placed, more = target.place_shards(w, m.shards, named)
        shards += placed
        moves += more
        add_fields(fields, m.fields)
        skipped += int(info.get("skipped_records") or 0)
    if skipped and not shards:
        raise WriterError(
            f"{target.base}: every record was skipped ({skipped}) and none written (a mistyped "
            "--field or --key-field does that); the workers' reports name each"
        )
    created = dict(spec.created)
    if skipped and isinstance(created.get("build"), dict):
        facts = {"skipped_records": skipped, "errors": errors_name(target.manifest_name)}
        created["build"] = {**created["build"], **facts}
    manifest = Manifest(shards, spec.checksum, fields, created, spec.part, base=target.base)
    return manifest, moves


def join_workers(target: Target, stem: str, workers: Sequence[Target], spec: JoinSpec) -> Manifest:
    """The one manifest over ``workers``' shards in ``target`` (module docstring); the work
    ``stem`` is deleted once it is written."""
    saved = target.saved_join(stem)
    manifest, moves = saved if saved is not None else _gather(target, workers, spec)
    target.commit_join(stem, manifest, moves)
    target.join_reports(workers)
    manifest.base = target.base
    target.write_manifest(manifest)
    target.drop_work(stem)
    return manifest
