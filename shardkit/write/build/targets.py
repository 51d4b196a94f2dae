"""Where a build keeps what it writes between runs: a local directory or an object-store
prefix (``shardkit build -o s3://bucket/prefix/``, ``gs://``, ``az://``).

A build reads back, on a later run, the state of an unfinished parallel build, whether one
is under way, and its manifest; it writes its report of skipped records beside the
manifest. :class:`LocalPlace` keeps them in the output directory (the work directory
``.{prefix}.work/``); :class:`ObjectPlace` keeps them as objects under the prefix:

- ``.{prefix}.work-build.json``: the build's facts (fingerprint, options), put before its
  workers start and deleted last when the manifest is written;
- ``.{prefix}.work-wNNNN.json``: each worker's own manifest (with its journal and ETag
  record, as any :class:`~shardkit.ShardWriter` into a store keeps them); the workers'
  shards are written straight under names of their own (``{prefix}-wNNNN-NNNNNN.tar``), so
  the final manifest lists them where they are, with no copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardkit.durable import atomic_write
from shardkit.errors import ShardkitError, WriterError
from shardkit.format.manifest.model import Manifest
from shardkit.io.stores import is_object_url
from shardkit.write.writer.outputs import ObjectOutput

if TYPE_CHECKING:
    from shardkit.write.build.config import BuildPlan
    from shardkit.write.inputs.sources import BadRecord

__all__ = [
    "ErrorLog",
    "LocalPlace",
    "ObjectErrorLog",
    "ObjectPlace",
    "Place",
    "build_info",
    "errors_name",
    "place_of",
    "read_manifest",
    "store_failures",
]


_STORE_CLIENTS = ("botocore.", "boto3.", "google.", "azure.", "s3transfer.")


@contextlib.contextmanager
def store_failures(where: str) -> Iterator[None]:
    """An object-store client's failure (no credentials, no bucket, a refused request) as a
    :class:`WriterError` naming ``where``, chained: one line at the CLI, not a traceback."""
    try:
        yield
    except ShardkitError:
        raise
    except Exception as exc:
        if not type(exc).__module__.startswith(_STORE_CLIENTS):
            raise
        raise WriterError(f"{where}: the store refused: {type(exc).__name__}: {exc}") from exc


def build_info(m: Manifest) -> dict[str, Any]:
    """The ``created.build`` block a build leaves in its manifest (config, complete)."""
    info = m.created.get("build")
    return info if isinstance(info, dict) else {}


def errors_name(manifest: str) -> str:
    """The skipped-records report beside a manifest: ``manifest.errors.jsonl``."""
    return os.path.splitext(manifest)[0] + ".errors.jsonl"


def read_manifest(out: str, name: str) -> Manifest | None:
    """The manifest ``name`` in ``out`` (a directory or an object-store url), or None."""
    if is_object_url(out):
        target = ObjectOutput(out, name)
        data = target.store.get(target.manifest_key)
        if data is None:
            return None
        m = Manifest.loads(data, source=target.manifest_path)
        m.base = target.base
        return m
    path = os.path.join(out, name)
    return Manifest.load(path) if os.path.exists(path) else None


class ErrorLog:
    """The report of skipped records: one JSON line each, created at the first one.

    A stale report is removed when a run starts: a resumed run reports every bad record
    again (it reads them again), so the report is always whole.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._f: Any = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def add(self, bad: BadRecord) -> None:
        if self._f is None:
            self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._f.write(json.dumps(bad.to_dict(), ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class ObjectErrorLog(ErrorLog):
    """The report of a build into an object store: kept in a local temp file while the
    build runs, streamed up beside the manifest (``name``) when it closes."""

    def __init__(self, out: ObjectOutput, name: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".shardkit-errors-", suffix=".jsonl")
        os.close(fd)
        super().__init__(tmp)
        self.out, self.key = out, out.key(name)
        out.store.delete(self.key)  # a stale one: this run reports every bad record again

    def close(self) -> None:
        super().close()
        if not os.path.exists(self.path):
            return
        try:
            if self.count:
                up = self.out.store.upload(self.key)
                with open(self.path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        up.write(chunk)
                up.complete()
        finally:
            os.unlink(self.path)


class Place:
    """What a build keeps in its output between runs (the module docstring)."""

    def __init__(self, plan: BuildPlan) -> None:
        self.plan = plan

    def state(self) -> dict[str, Any] | None:
        """The facts an unfinished parallel build recorded (its fingerprint), or None."""
        raise NotImplementedError

    def has_work(self) -> bool:
        """Whether an unfinished parallel build left its work here."""
        raise NotImplementedError

    def begin(self) -> bool:
        """Record the build's facts before its workers start; True if every worker had
        finished and only the final step was left."""
        raise NotImplementedError

    def manifest(self) -> Manifest | None:
        """The build's manifest there, or None."""
        return read_manifest(self.plan.out_dir, self.plan.manifest_name)


class LocalPlace(Place):
    """A local output directory: the work directory ``.{prefix}.work/``."""

    def _state_path(self) -> str:
        return os.path.join(self.plan.work_dir, "build.json")

    def state(self) -> dict[str, Any] | None:
        path = self._state_path()
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            loaded: dict[str, Any] = json.load(f)
        return loaded

    def has_work(self) -> bool:
        return os.path.exists(self.plan.work_dir)

    def begin(self) -> bool:
        os.makedirs(self.plan.work_dir, exist_ok=True)
        if not os.path.exists(self._state_path()):
            atomic_write(self._state_path(), json.dumps(self.plan.meta).encode())
        return os.path.exists(os.path.join(self.plan.work_dir, "finalize.json"))


class ObjectPlace(Place):
    """An object-store prefix: ``.{prefix}.work-*`` objects beside the shards."""

    def __init__(self, plan: BuildPlan) -> None:
        super().__init__(plan)
        self.out = ObjectOutput(plan.out_dir, plan.manifest_name)
        self.stem = f".{plan.shard_prefix}.work-"

    def worker_manifest(self, i: int) -> str:
        """Worker ``i``'s own manifest name."""
        return f"{self.stem}w{i:04d}.json"

    def worker_prefix(self, i: int) -> str:
        """Worker ``i``'s shard prefix: its shards keep the names they are written under."""
        return f"{self.plan.shard_prefix}-w{i:04d}"

    @property
    def state_key(self) -> str:
        return self.out.key(self.stem + "build.json")

    def state(self) -> dict[str, Any] | None:
        data = self.out.store.get(self.state_key)
        if data is None:
            return None
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    def has_work(self) -> bool:
        return self.out.store.head(self.state_key) is not None

    def begin(self) -> bool:
        if not self.has_work():
            self.out.store.put(self.state_key, json.dumps(self.plan.meta).encode())
        return False  # the final step reads the workers' manifests again: no plan of it kept

    def work_keys(self) -> list[str]:
        """Every work object (the workers' manifests, journals, ETag records, reports) but
        the state, which goes last."""
        heads = (self.out.key(self.stem), self.out.key("." + self.stem))
        keys = [info.key for head in heads for info in self.out.store.list(head)]
        return sorted(k for k in keys if k != self.state_key)


def place_of(plan: BuildPlan) -> Place:
    """The place of ``plan``'s output: an object-store prefix or a local directory."""
    return ObjectPlace(plan) if is_object_url(plan.out_dir) else LocalPlace(plan)
