"""An object-store prefix (``s3://``, ``gs://``, ``az://``) as a writer's or a build's target
(:mod:`shardkit.write.writer.target`).

A shard is streamed up as it is written (a multipart, resumable or block upload keeping one
part in memory: :mod:`shardkit.io.stores`) and appears only when it is whole; its sample
index follows, then its journal entry, one small object per shard under
``.{manifest}.journal.d/`` (an object store cannot append). The manifest and its CSV go
last, after ``.{manifest}.etags.json`` (each listed shard's ETag as it was written). On
resume a shard counts only if the manifest or its journal entry lists it and the object has
the size and ETag recorded when it was written: what is verifiably there. (A remote
manifest's compact form is built by each node from the manifest bytes, so none is uploaded.)

A build locks the prefix with lock objects (:mod:`shardkit.write.writer.object_lock`). A
parallel build keeps its state as ``.{stem}-build.json`` (put before its workers start,
deleted last); each worker writes its own manifest ``.{stem}-{tag}.json`` and its shards
straight under names of its own (``{prefix}-{tag}-NNNNNN.tar``), so the joined manifest
lists them where they are: an object store has no rename, and a copy would cost what the
upload did.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from shardkit.format.layout import INDEX_DIR
from shardkit.format.manifest.journal import parse_journal
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.io.store_base import ObjectStore, Upload
from shardkit.io.stores import open_store
from shardkit.write.writer.object_lock import ObjectLock
from shardkit.write.writer.target import ErrorLog, Existing, Lock, Moves, Target, errors_name

__all__ = ["ObjectTarget"]


class ObjectErrorLog(ErrorLog):
    """The report of a build into an object store: kept in a local temp file while the
    build runs, streamed up beside the manifest when it closes."""

    def __init__(self, out: ObjectTarget, key: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".shardkit-errors-", suffix=".jsonl")
        os.close(fd)
        super().__init__(tmp)
        self.out, self.key = out, key
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


class ObjectTarget(Target):
    """An object-store prefix (module docstring)."""

    def __init__(self, url: str, manifest: str = "manifest.json", endpoint_url: str | None = None):
        self.url, self.endpoint_url = url, endpoint_url
        self.store: ObjectStore
        self.store, prefix = open_store(url, endpoint_url=endpoint_url)
        self.prefix = prefix.rstrip("/")
        self.base = self.store.url(self.prefix) if self.prefix else self.store.url("").rstrip("/")
        self.manifest_name = manifest
        self.manifest_key = self.key(manifest)
        self.manifest_path = self.store.url(self.manifest_key)
        self._journal_dir = self.key(f".{manifest}.journal.d") + "/"
        self._tags_key = self.key(f".{manifest}.etags.json")
        self.tags: dict[str, str] = {}  # shard name -> ETag, as published or journalled

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectTarget, (self.url, self.manifest_name, self.endpoint_url))

    def key(self, name: str) -> str:
        """The store key of ``name`` under this prefix."""
        return posixpath.join(self.prefix, name) if self.prefix else name

    # -- the place -----------------------------------------------------------------
    def sibling(self, manifest: str) -> ObjectTarget:
        return ObjectTarget(self.url, manifest, self.endpoint_url)

    def worker(self, stem: str, tag: str, prefix: str) -> tuple[Target, str]:
        return self.sibling(f".{stem}-{tag}.json"), f"{prefix}-{tag}"

    def put(self, rel: str, data: bytes) -> None:
        self.store.put(self.key(rel), data)

    # -- shards and indexes --------------------------------------------------------
    def prepare(self, prefix: str) -> None:
        self.store.abort_stale(self.key(prefix))

    def open_shard(self, name: str) -> BinaryIO:
        up: Any = self.store.upload(self.key(name))
        return up  # type: ignore[no-any-return]

    def publish(self, sink: BinaryIO, name: str, index_name: str, index: bytes) -> str:
        assert isinstance(sink, Upload)
        tag = sink.complete()
        self.store.put(self.key(index_name), index)
        self.tags[name] = tag
        return tag

    def drop(self, sink: BinaryIO | None) -> None:
        if isinstance(sink, Upload):
            sink.abort()

    def check_shard(self, entry: ShardEntry, tag: str | None) -> str | None:
        info = self.store.head(self.key(entry.url))
        if info is None:
            return "is missing"
        if info.size != entry.size:
            return f"has {info.size} bytes, not {entry.size}"
        want = tag if tag is not None else self.tags.get(entry.url)
        if want and info.etag != want:
            return f"was replaced since it was written (ETag {info.etag}, not {want})"
        return None

    # -- journal and manifest ------------------------------------------------------
    def append_journal(self, name: str, line: bytes) -> None:
        raw = json.loads(line)
        raw["etag"] = self.tags.get(name, "")
        self.store.put(self._journal_dir + name + ".json", json.dumps(raw).encode() + b"\n")

    def forget_journal(self) -> None:
        for info in list(self.store.list(self._journal_dir)):
            self.store.delete(info.key)

    def write_manifest(self, manifest: Manifest) -> None:
        tags = {e.url: self.tags[e.url] for e in manifest.shards if e.url in self.tags}
        self.store.put(self._tags_key, json.dumps(tags, sort_keys=True).encode())
        self.store.put(os.path.splitext(self.manifest_key)[0] + ".csv", manifest.to_csv().encode())
        self.store.put(self.manifest_key, manifest.dumps().encode())
        self.forget_journal()

    def existing(self) -> Existing:
        tags = self.store.get(self._tags_key)
        if tags:
            self.tags.update({str(k): str(v) for k, v in json.loads(tags).items()})
        old = self.read_manifest()
        lines = b""
        for info in sorted(self.store.list(self._journal_dir), key=lambda i: i.key):
            one = self.store.get(info.key) or b""
            raw = json.loads(one) if one.strip() else {}
            name = posixpath.basename(info.key)[: -len(".json")]
            if raw.get("etag"):
                self.tags[name] = str(raw["etag"])
            lines += one if one.endswith(b"\n") else b""
        return old, parse_journal(lines, self.manifest_path + ".journal.d", self.manifest_path)

    def has_manifest(self) -> bool:
        return self.store.head(self.manifest_key) is not None

    def read_manifest(self) -> Manifest | None:
        data = self.store.get(self.manifest_key)
        if data is None:
            return None
        m = Manifest.loads(data, source=self.manifest_path)
        m.base = self.base
        return m

    def shard_names(self, prefix: str) -> list[str]:
        mine = re.compile(rf"^{re.escape(prefix)}-\d{{6,}}\.tar(?:\.zst|\.gz)?$")
        head = self.key(prefix)[: -len(prefix)]
        names = (i.key[len(head) :] for i in self.store.list(head + prefix))
        return sorted(n for n in names if mine.match(n))

    def remove_existing(self, prefix: str, *, worker_names: bool = False) -> int:
        """Delete the data set here, its manifest first (so no manifest ever lists a deleted
        object), its ETag record and CSV, then the shards and indexes it lists under this
        prefix, the shards of ``prefix`` (with ``worker_names``, a parallel build's
        ``{prefix}-wNNNN-...`` too), its journal and report."""
        name = self.manifest_name
        data = self.store.get(self.manifest_key)
        stem = posixpath.splitext(name)[0]
        for first in (name, f".{name}.etags.json", stem + ".csv"):
            self.store.delete(self.key(first))
        doomed: set[str] = set()
        old = Manifest.loads(data, source=self.manifest_path) if data is not None else None
        for s in old.shards if old is not None else []:
            for url in (s.url, s.index):
                if url and "://" not in url and ".." not in url.split("/"):
                    doomed.add(self.key(url))
        workers = r"(?:-w\d{4})?" if worker_names else ""
        mine = re.compile(rf"^{re.escape(prefix)}{workers}-\d{{6,}}\.tar(?:\.zst|\.gz)?(?:\.idx)?$")
        top = self.key(prefix)[: -len(prefix)]
        for head in (top, top + INDEX_DIR + "/"):  # stray shards, and indexes of either layout
            doomed.update(
                i.key for i in self.store.list(head + prefix) if mine.match(i.key[len(head) :])
            )
        doomed.update(i.key for i in self.store.list(self._journal_dir))
        doomed.add(self.key(stem + ".errors.jsonl"))
        for key in sorted(doomed):
            self.store.delete(key)
        return len(doomed)

    # -- report --------------------------------------------------------------------
    def error_log(self) -> ErrorLog:
        return ObjectErrorLog(self, self.key(errors_name(self.manifest_name)))

    def join_reports(self, sources: Sequence[Target]) -> None:
        target = self.key(errors_name(self.manifest_name))
        self.store.delete(target)
        reports = [self.key(errors_name(s.manifest_name)) for s in sources]
        found = [k for k in reports if self.store.head(k) is not None]
        if not found:
            return
        up = self.store.upload(target)
        try:
            for key in found:
                up.write(self.store.get(key) or b"")
            up.complete()
        finally:
            up.abort()

    # -- lock ----------------------------------------------------------------------
    def lock(self, names: Sequence[str], *, owner: object | None = None) -> Lock | None:
        keys = [self.key(f".lock-{n}") for n in names]
        return ObjectLock(self.store, keys, self.base, via=self, owner=owner)

    # -- a parallel build's work state ---------------------------------------------
    def work_name(self, stem: str) -> str:
        return f"{self.base}/.{stem}-*"

    def _state_key(self, stem: str) -> str:
        return self.key(f".{stem}-build.json")

    def work_state(self, stem: str) -> dict[str, Any] | None:
        data = self.store.get(self._state_key(stem))
        if data is None:
            return None
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    def has_work(self, stem: str) -> bool:
        return self.store.head(self._state_key(stem)) is not None

    def begin_work(self, stem: str, meta: dict[str, Any]) -> bool:
        if not self.has_work(stem):
            self.store.put(self._state_key(stem), json.dumps(meta).encode())
        return False  # the join reads the workers' manifests again: no plan of it kept

    def drop_work(self, stem: str, *, shards: str | None = None) -> None:
        state = self._state_key(stem)
        # the workers' manifests; their journals and ETag records; the locks of a worker
        # killed with its job (a task Ray stopped)
        heads = [self.key(f".{stem}-"), self.key(f"..{stem}-"), self.key(f".lock-.{stem}-")]
        if shards is not None:
            heads += [self.key(shards), self.key(f"{INDEX_DIR}/{shards}")]
            heads.append(self.key(f".lock-{shards}"))
        keys = {info.key for head in heads for info in self.store.list(head)}
        for key in sorted(keys - {state}):
            self.store.delete(key)
        self.store.delete(state)

    # -- clear and join ------------------------------------------------------------
    def clear(self, prefix: str, stem: str) -> int:
        removed = self.remove_existing(prefix, worker_names=True)
        self.drop_work(stem)
        return removed

    def place_shards(
        self, worker: Target, shards: Sequence[ShardEntry], name: Callable[[int], str]
    ) -> tuple[list[ShardEntry], Moves]:
        """Listed where they are, with the ETags the worker recorded."""
        del name
        if isinstance(worker, ObjectTarget):
            self.tags.update(worker.tags)
        return list(shards), []
