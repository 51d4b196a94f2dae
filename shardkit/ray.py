"""Writing shardkit shards from Ray Data: ``ds.write_datasink(ShardDatasink(out))``.

Every write task turns its blocks' rows into samples with a :class:`~shardkit.ShardWriter`
of its own, in a work directory under ``out`` (a filesystem every Ray worker sees: local
for a one-machine Ray, a shared mount for a cluster). When every task has finished, the
driver renames the tasks' shards into one sequence (``data-000000.tar``, ...) in task order,
with their sample indexes, and writes one manifest, last and atomically. A failed job
leaves no manifest: its work directory is removed, and a crashed driver leaves only the
work directory (``.ray-write-*``), never a manifest listing partial shards.

``out`` may be an object-store url (``s3://``, ``gs://``, ``az://``): no shared disk is
needed. Each task then streams its shards straight into the store under names of its own
(``data-{run}-t{task:06d}-000000.tar``: nothing to rename), with a manifest of its own;
the driver writes one manifest over every task's shards, in task order, last, and removes
the tasks' manifests. A failed job removes what its tasks wrote.

A row is a sample: ``__key__`` (optional; ``{task:06d}/{row:09d}`` when missing) and one
value per field, encoded by its extension as :meth:`ShardWriter.write` does (``jpg`` bytes,
``json`` objects, ``npy`` arrays, ``txt`` strings, ``cls`` ints). ray is the optional extra
``shardkit[ray]`` and is imported only when this module is.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ray.data import Datasink  # the optional extra: importing shardkit.ray needs ray

from shardkit.errors import ConfigError
from shardkit.format.layout import INDEX_DIR, index_name
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest, ShardEntry, creation_info
from shardkit.io.stores import is_object_url
from shardkit.write.writer import (
    DEFAULT_CHECKSUM,
    DEFAULT_PREFIX,
    ShardWriter,
    WriterKeywords,
    shard_name,
)
from shardkit.write.writer.outputs import ObjectOutput, local_target

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only annotations use it

__all__ = ["ShardDatasink"]

_WORK = ".ray-write-"


# Any when ray's types are not installed, hence the second ignore code
class ShardDatasink(Datasink[dict[str, Any]]):  # type: ignore[misc, unused-ignore]
    """A Ray Data sink writing shardkit shards and one manifest into ``out_dir``.

    Args:
        out_dir: the directory for the shards and ``manifest.json`` (must not hold one).
        options: the keyword options of :class:`ShardWriter` (``prefix``, ``maxsize``,
            ``maxcount``, ``checksum``, ``compress``, ``piece_size``, ``image_quality``),
            given to every task's writer; shards are renamed into one sequence as
            :class:`ShardWriter` names them.
    """

    def __init__(self, out_dir: str | os.PathLike[str], **options: Unpack[WriterKeywords]) -> None:
        self.remote = is_object_url(out_dir)
        if self.remote:
            self.out_dir = str(out_dir).rstrip("/") + "/"
        else:
            self.out_dir = os.path.abspath(local_target(out_dir, "ShardDatasink"))
        self.options = options
        self.run = uuid.uuid4().hex[:12]
        self.work_dir = os.path.join(self.out_dir, _WORK + self.run)
        self.manifest: Manifest | None = None  # set on the driver when the write is done

    def get_name(self) -> str:
        return "ShardDatasink"

    @property
    def supports_distributed_writes(self) -> bool:
        return True

    def on_write_start(self, *args: Any, **kwargs: Any) -> None:
        if self.remote:
            if ObjectOutput(self.out_dir, "manifest.json").has_manifest():
                raise ConfigError(f"{self.out_dir} already holds a manifest.json; use another one")
            return
        if os.path.exists(os.path.join(self.out_dir, "manifest.json")):
            raise ConfigError(f"{self.out_dir} already holds a manifest.json; use another dir")
        os.makedirs(self.work_dir, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        """Write one task's blocks as shards in its own directory (runs on a Ray worker)."""
        from ray.data.block import BlockAccessor

        task = int(ctx.task_idx)
        n = 0
        row: Any
        with self._task_writer(task) as w:
            for block in blocks:
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    sample = dict(row)
                    sample.setdefault("__key__", f"{task:06d}/{n:09d}")
                    w.write(sample)
                    n += 1
        return {"task": task, "samples": n}

    def _task_writer(self, task: int) -> ShardWriter:
        if not self.remote:
            return ShardWriter(os.path.join(self.work_dir, f"task-{task:06d}"), **self.options)
        # straight into the store under a name of the task's own: no rename needed after
        opts = dict(self.options)
        opts["prefix"] = f"{opts.get('prefix', DEFAULT_PREFIX)}-{self.run}-t{task:06d}"
        return ShardWriter(self.out_dir, manifest=self._task_manifest(task), **opts)  # type: ignore[arg-type]

    def _task_manifest(self, task: int) -> str:
        return f"{_WORK}{self.run}-task-{task:06d}.json"

    def on_write_complete(self, write_result: Any, *args: Any, **kwargs: Any) -> None:
        """Rename every task's shards into one sequence; write the manifest last."""
        results = getattr(write_result, "write_returns", write_result)
        tasks = sorted(int(r["task"]) for r in results)
        if self.remote:
            self._complete_remote(tasks)
            return
        shards: list[ShardEntry] = []
        fields: dict[str, dict[str, int]] = {}
        prefix = self.options.get("prefix", DEFAULT_PREFIX)
        compress = self.options.get("compress")
        for task in tasks:
            tdir = os.path.join(self.work_dir, f"task-{task:06d}")
            m = Manifest.load(os.path.join(tdir, "manifest.json"))
            for s in m.shards:
                name = shard_name(prefix, len(shards), compress)
                os.replace(os.path.join(tdir, s.url), os.path.join(self.out_dir, name))
                index = None
                if s.index:
                    index = index_name(name)
                    dst = os.path.join(self.out_dir, index)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    os.replace(os.path.join(tdir, s.index), dst)
                shards.append(dataclasses.replace(s, url=name, index=index))
            for fname, st in m.fields.items():
                acc = fields.setdefault(fname, {"count": 0, "bytes": 0})
                acc["count"] += st["count"]
                acc["bytes"] += st["bytes"]
        algo = self.options.get("checksum", DEFAULT_CHECKSUM)
        created = creation_info(source="shardkit.ray.ShardDatasink")
        manifest = Manifest(shards, algo, fields, created, base=self.out_dir)
        save_manifest(manifest, os.path.join(self.out_dir, "manifest.json"))
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.manifest = manifest

    def _complete_remote(self, tasks: list[int]) -> None:
        """One manifest over every task's shards, in task order, written last."""
        shards: list[ShardEntry] = []
        fields: dict[str, dict[str, int]] = {}
        final = ObjectOutput(self.out_dir, "manifest.json")
        for task in tasks:
            out = ObjectOutput(self.out_dir, self._task_manifest(task))
            m, journal = out.existing()
            if m is None or journal:
                raise ConfigError(f"{self.out_dir}: task {task} left no whole manifest")
            shards.extend(m.shards)
            final.tags.update(out.tags)
            for fname, st in m.fields.items():
                acc = fields.setdefault(fname, {"count": 0, "bytes": 0})
                acc["count"] += st["count"]
                acc["bytes"] += st["bytes"]
        algo = self.options.get("checksum", DEFAULT_CHECKSUM)
        created = creation_info(source="shardkit.ray.ShardDatasink")
        manifest = Manifest(shards, algo, fields, created, base=final.base)
        final.write_manifest(manifest)
        self._remove_remote(shards_too=False)
        self.manifest = manifest

    def _remove_remote(self, *, shards_too: bool) -> None:
        """The tasks' manifests (and, after a failure, their shards) in the store."""
        out = ObjectOutput(self.out_dir, "manifest.json")
        stem = out.key(f"{_WORK}{self.run}-")
        names = [stem]
        if shards_too:
            tasks = f"{self.options.get('prefix', DEFAULT_PREFIX)}-{self.run}-t"
            names += [out.key(tasks), out.key(f"{INDEX_DIR}/{tasks}")]
        for start in names:
            for info in list(out.store.list(start)):
                out.store.delete(info.key)
        for info in list(out.store.list(out.key(f".{_WORK}{self.run}-"))):
            out.store.delete(info.key)  # the tasks' ETag records and journals

    def on_write_failed(self, error: Exception, *args: Any, **kwargs: Any) -> None:
        """Remove every task's shards: a failed job leaves no manifest and no shards."""
        del error
        if self.remote:
            self._remove_remote(shards_too=True)
            return
        shutil.rmtree(self.work_dir, ignore_errors=True)
