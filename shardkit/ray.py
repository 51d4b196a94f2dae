"""Writing shardkit shards from Ray Data: ``ds.write_datasink(ShardDatasink(out))``.

Every write task turns its blocks' rows into samples with a :class:`~shardkit.ShardWriter`
of its own, in a place of its own under ``out`` (:meth:`Target.worker`): a work folder
``.ray-write-{run}/`` on a filesystem every Ray worker sees (local for a one-machine Ray, a
shared mount for a cluster), or, for an object-store url (``s3://``, ``gs://``, ``az://``: no
shared disk needed), names of its own under the prefix (``data-{run}-t{task:06d}-000000.tar``
and a manifest of its own). When every task has finished, the driver writes one manifest over
every task's shards, in task order, last (:mod:`shardkit.write.build.join`: in a folder the
shards are renamed into one sequence ``data-000000.tar``, ...), and removes the tasks' work.
A failed job leaves no manifest and removes what its tasks wrote; a crashed driver leaves
only the work (``.ray-write-*``), never a manifest listing partial shards.

A row is a sample: ``__key__`` (optional; ``{task:06d}/{row:09d}`` when missing) and one
value per field, encoded by its extension as :meth:`ShardWriter.write` does (``jpg`` bytes,
``json`` objects, ``npy`` arrays, ``txt`` strings, ``cls`` ints). ray is the optional extra
``shardkit[ray]`` and is imported only when this module is.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ray.data import Datasink  # the optional extra: importing shardkit.ray needs ray

from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest, creation_info
from shardkit.write.build.join import JoinSpec, join_workers
from shardkit.write.writer import (
    DEFAULT_CHECKSUM,
    DEFAULT_PREFIX,
    ShardWriter,
    WriterKeywords,
    WriterOptions,
)
from shardkit.write.writer.target import Lock, Target
from shardkit.write.writer.where import open_target

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only annotations use it

__all__ = ["ShardDatasink"]

# the lock each job's driver holds on its output, by run id: a lock is no part of the sink
# that Ray sends to its tasks
_LOCKS: dict[str, Lock] = {}


# Any when ray's types are not installed, hence the second ignore code
class ShardDatasink(Datasink[dict[str, Any]]):  # type: ignore[misc, unused-ignore]
    """A Ray Data sink writing shardkit shards and one manifest into ``out_dir``.

    Args:
        out_dir: the directory (or object-store prefix) for the shards and
            ``manifest.json`` (must not hold one).
        options: the keyword options of :class:`ShardWriter` (``prefix``, ``maxsize``,
            ``maxcount``, ``checksum``, ``compress``, ``piece_size``, ``image_quality``),
            given to every task's writer; shards are renamed into one sequence as
            :class:`ShardWriter` names them.
    """

    def __init__(self, out_dir: str | os.PathLike[str], **options: Unpack[WriterKeywords]) -> None:
        WriterOptions().with_keywords(dict(options))  # a bad option here, not in every task
        self.target: Target = open_target(out_dir)
        self.out_dir = self.target.base
        self.options = options
        self.prefix = str(options.get("prefix", DEFAULT_PREFIX))
        self.run = uuid.uuid4().hex[:12]
        self.stem = f"ray-write-{self.run}"
        self.manifest: Manifest | None = None  # set on the driver when the write is done

    def get_name(self) -> str:
        return "ShardDatasink"

    @property
    def supports_distributed_writes(self) -> bool:
        return True

    def _task(self, task: int) -> tuple[Target, str]:
        """Task ``task``'s own place and shard prefix."""
        return self.target.worker(self.stem, f"{self.run}-t{task:06d}", self.prefix)

    def on_write_start(self, *args: Any, **kwargs: Any) -> None:
        """Lock the output for this job (a second job there is refused, naming this one),
        and refuse one that holds a data set already."""
        lock = self.target.lock((self.target.manifest_name, f"{self.prefix}-shards"))
        if lock is not None:
            lock.acquire()
            _LOCKS[self.run] = lock
        try:
            if self.target.has_manifest():
                raise ConfigError(f"{self.out_dir} already holds a manifest.json; use another one")
        except BaseException:
            self._unlock()
            raise

    def _unlock(self) -> None:
        lock = _LOCKS.pop(self.run, None)
        if lock is not None:
            lock.release()

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        """Write one task's blocks as shards in its own place (runs on a Ray worker)."""
        from ray.data.block import BlockAccessor

        task = int(ctx.task_idx)
        n = 0
        row: Any
        target, prefix = self._task(task)
        opts = {**self.options, "prefix": prefix}
        with ShardWriter(target, **opts) as w:  # type: ignore[arg-type]
            for block in blocks:
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    sample = dict(row)
                    sample.setdefault("__key__", f"{task:06d}/{n:09d}")
                    w.write(sample)
                    n += 1
        return {"task": task, "samples": n}

    def on_write_complete(self, write_result: Any, *args: Any, **kwargs: Any) -> None:
        """One manifest over every task's shards, in task order, written last."""
        results = getattr(write_result, "write_returns", write_result)
        tasks = sorted(int(r["task"]) for r in results)
        workers = [self._task(task)[0] for task in tasks]
        created = creation_info(source="shardkit.ray.ShardDatasink")
        algo = str(self.options.get("checksum", DEFAULT_CHECKSUM))
        compress = self.options.get("compress")
        spec = JoinSpec(self.prefix, compress, algo, created)
        try:
            self.manifest = join_workers(self.target, self.stem, workers, spec)
        finally:
            self._unlock()

    def on_write_failed(self, error: Exception, *args: Any, **kwargs: Any) -> None:
        """Remove every task's shards: a failed job leaves no manifest and no shards."""
        del error
        try:
            self.target.drop_work(self.stem, shards=f"{self.prefix}-{self.run}-t")
        finally:
            self._unlock()
