"""Writing shardkit shards from Ray Data: ``ds.write_datasink(ShardDatasink(out))``.

Every write task turns its blocks' rows into samples with a :class:`~shardkit.ShardWriter`
of its own, in a work directory under ``out`` (a filesystem every Ray worker sees: local
for a one-machine Ray, a shared mount for a cluster). When every task has finished, the
driver renames the tasks' shards into one sequence (``data-000000.tar``, ...) in task order,
with their sample indexes, and writes one manifest, last and atomically. A failed job
leaves no manifest: its work directory is removed, and a crashed driver leaves only the
work directory (``.ray-write-*``), never a manifest listing partial shards.

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
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest, ShardEntry, creation_info
from shardkit.write.outputs import local_target
from shardkit.write.writer import (
    DEFAULT_CHECKSUM,
    DEFAULT_PREFIX,
    ShardWriter,
    WriterOptions,
    shard_name,
)

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

    def __init__(self, out_dir: str | os.PathLike[str], **options: Unpack[WriterOptions]) -> None:
        self.out_dir = os.path.abspath(local_target(out_dir, "ShardDatasink"))
        self.options = options
        self.work_dir = os.path.join(self.out_dir, _WORK + uuid.uuid4().hex[:12])
        self.manifest: Manifest | None = None  # set on the driver when the write is done

    def get_name(self) -> str:
        return "ShardDatasink"

    @property
    def supports_distributed_writes(self) -> bool:
        return True

    def on_write_start(self, *args: Any, **kwargs: Any) -> None:
        if os.path.exists(os.path.join(self.out_dir, "manifest.json")):
            raise ConfigError(f"{self.out_dir} already holds a manifest.json; use another dir")
        os.makedirs(self.work_dir, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        """Write one task's blocks as shards in its own directory (runs on a Ray worker)."""
        from ray.data.block import BlockAccessor

        task = int(ctx.task_idx)
        tdir = os.path.join(self.work_dir, f"task-{task:06d}")
        n = 0
        row: Any
        with ShardWriter(tdir, **self.options) as w:
            for block in blocks:
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    sample = dict(row)
                    sample.setdefault("__key__", f"{task:06d}/{n:09d}")
                    w.write(sample)
                    n += 1
        return {"task": task, "samples": n}

    def on_write_complete(self, write_result: Any, *args: Any, **kwargs: Any) -> None:
        """Rename every task's shards into one sequence; write the manifest last."""
        results = getattr(write_result, "write_returns", write_result)
        tasks = sorted(int(r["task"]) for r in results)
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
                    index = name + ".idx"
                    os.replace(os.path.join(tdir, s.index), os.path.join(self.out_dir, index))
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

    def on_write_failed(self, error: Exception, *args: Any, **kwargs: Any) -> None:
        """Remove every task's shards: a failed job leaves no manifest and no shards."""
        del error
        shutil.rmtree(self.work_dir, ignore_errors=True)
