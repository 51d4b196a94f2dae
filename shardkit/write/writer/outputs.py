"""Where a :class:`~shardkit.ShardWriter` puts what it writes: a local directory or an
object-store prefix (``s3://``, ``gs://``, ``az://``). The writer packs samples; an output
makes a shard appear whole or not at all, keeps the journal of finished shards and writes
the manifest last.

- :class:`LocalOutput`: a shard goes to a temp name, is fsynced and renamed; the journal is
  one file of fsynced lines; the manifest (with its CSV and compact form) is written
  atomically.
- :class:`ObjectOutput`: a shard is streamed up as it is written (a multipart, resumable or
  block upload keeping one part in memory: :mod:`shardkit.io.stores`) and appears only when
  it is whole; its sample index follows, then its journal entry, one small object per shard
  under ``.{manifest}.journal.d/`` (an object store cannot append). The manifest and its CSV
  go last, after ``.{manifest}.etags.json`` (each listed shard's ETag as it was written). On
  resume a shard counts only if the manifest or its journal entry lists it and the object
  has the size and ETag recorded when it was written: what is verifiably there. (A remote
  manifest's compact form is built by each node from the manifest bytes, so none is
  uploaded.)
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
from typing import Any, BinaryIO

from shardkit.durable import atomic_write
from shardkit.errors import ConfigError
from shardkit.format.layout import INDEX_DIR
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.journal import journal_path, parse_journal, read_journal
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.io.stores import ObjectStore, Upload, is_object_url, open_store

__all__ = [
    "Existing",
    "LocalOutput",
    "ObjectOutput",
    "Output",
    "local_target",
    "make_output",
    "pid_alive",
]

Existing = tuple[Manifest | None, list[tuple[ShardEntry, dict[str, dict[str, int]]]]]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a live writer's temp file is not ours to delete)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Output:
    """What a writer needs of the place it writes to (see the module docstring)."""

    base: str
    manifest_path: str

    def prepare(self, prefix: str) -> None:
        """Make the place ready and clear what dead writers of ``prefix`` left there."""
        raise NotImplementedError

    def open_shard(self, name: str) -> BinaryIO:
        """A sink for shard ``name``'s bytes (invisible under ``name`` until published)."""
        raise NotImplementedError

    def publish(self, sink: BinaryIO, name: str, index_name: str, index: bytes) -> str:
        """Make shard ``name`` (and its index) appear whole; a version tag of it."""
        raise NotImplementedError

    def drop(self, sink: BinaryIO | None) -> None:
        """Drop a shard being written: nothing of it appears."""
        raise NotImplementedError

    def append_journal(self, name: str, line: bytes) -> None:
        raise NotImplementedError

    def forget_journal(self) -> None:
        raise NotImplementedError

    def write_manifest(self, manifest: Manifest) -> None:
        raise NotImplementedError

    def existing(self) -> Existing:
        """The manifest there (or None) and the journal entries not folded into it."""
        raise NotImplementedError

    def has_manifest(self) -> bool:
        raise NotImplementedError

    def check_shard(self, entry: ShardEntry, tag: str | None) -> str | None:
        """None if shard ``entry`` is there whole, else what is wrong with it."""
        raise NotImplementedError


class LocalOutput(Output):
    """A local directory (module docstring)."""

    def __init__(self, out_dir: str, manifest: str) -> None:
        self.out_dir = out_dir
        self.base = os.path.abspath(out_dir)
        self.manifest_path = os.path.join(out_dir, manifest)
        self._journal: BinaryIO | None = None
        self._tmp: dict[int, str] = {}

    def prepare(self, prefix: str) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        mine = re.compile(rf"^\.{re.escape(prefix)}-\d{{6,}}\.tar(?:\.zst|\.gz)?\.tmp-(\d+)$")
        stem = re.escape(os.path.splitext(os.path.basename(self.manifest_path))[0])
        ours = re.compile(rf"^\.tmp-\w+-{stem}\.(?:json|json\.cols|csv)$")
        for name in os.listdir(self.out_dir):
            m = mine.match(name)
            if (m is not None and not pid_alive(int(m.group(1)))) or ours.match(name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.out_dir, name))

    def open_shard(self, name: str) -> BinaryIO:
        tmp = os.path.join(self.out_dir, f".{name}.tmp-{os.getpid()}")
        f = open(tmp, "wb", buffering=0)  # noqa: SIM115
        self._tmp[id(f)] = tmp
        return f

    def publish(self, sink: BinaryIO, name: str, index_name: str, index: bytes) -> str:
        tmp = self._tmp.pop(id(sink))
        try:
            os.fsync(sink.fileno())
        finally:
            sink.close()
        index_path = os.path.join(self.out_dir, index_name)
        os.makedirs(os.path.dirname(index_path), exist_ok=True)  # the .index/ folder
        atomic_write(index_path, index)
        os.replace(tmp, os.path.join(self.out_dir, name))
        return ""

    def drop(self, sink: BinaryIO | None) -> None:
        if sink is None:
            return
        tmp = self._tmp.pop(id(sink), None)
        try:
            sink.close()
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def append_journal(self, name: str, line: bytes) -> None:
        del name
        if self._journal is None:
            self._journal = open(journal_path(self.manifest_path), "ab", buffering=0)  # noqa: SIM115
        self._journal.write(line)
        os.fsync(self._journal.fileno())

    def forget_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(journal_path(self.manifest_path))

    def write_manifest(self, manifest: Manifest) -> None:
        save_manifest(manifest, self.manifest_path)
        self.forget_journal()

    def existing(self) -> Existing:
        journal = read_journal(self.manifest_path)
        old = Manifest.load(self.manifest_path) if os.path.exists(self.manifest_path) else None
        return old, journal

    def has_manifest(self) -> bool:
        return os.path.exists(self.manifest_path)

    def check_shard(self, entry: ShardEntry, tag: str | None) -> str | None:
        del tag
        try:
            size = os.path.getsize(os.path.join(self.out_dir, entry.url))
        except OSError:
            size = -1
        return None if size == entry.size else f"is missing or has {size} bytes, not {entry.size}"


class ObjectOutput(Output):
    """An object-store prefix (module docstring)."""

    def __init__(self, url: str, manifest: str, *, endpoint_url: str | None = None) -> None:
        self.store: ObjectStore
        self.store, prefix = open_store(url, endpoint_url=endpoint_url)
        self.prefix = prefix.rstrip("/")
        self.base = self.store.url(self.prefix) if self.prefix else self.store.url("").rstrip("/")
        self.manifest_key = self.key(manifest)
        self.manifest_path = self.store.url(self.manifest_key)
        self._journal_dir = self.key(f".{manifest}.journal.d") + "/"
        self._tags_key = self.key(f".{manifest}.etags.json")
        self.tags: dict[str, str] = {}  # shard name -> ETag, as published or journalled

    def key(self, name: str) -> str:
        """The store key of ``name`` under this output's prefix."""
        return posixpath.join(self.prefix, name) if self.prefix else name

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
        data = self.store.get(self.manifest_key)
        tags = self.store.get(self._tags_key)
        if tags:
            self.tags.update({str(k): str(v) for k, v in json.loads(tags).items()})
        old = None
        if data is not None:
            old = Manifest.loads(data, source=self.manifest_path)
            old.base = self.base
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

    def remove_existing(self, prefix: str, *, worker_names: bool = False) -> int:
        """``overwrite``: delete the data set here, its manifest first (so no manifest ever
        lists a deleted object), its ETag record and CSV, then the shards and indexes it
        lists under this prefix, the shards of ``prefix`` (with ``worker_names``, a
        parallel build's ``{prefix}-wNNNN-...`` too), its journal and report; how many."""
        name = posixpath.basename(self.manifest_key)
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


def make_output(
    target: str | os.PathLike[str], manifest: str, *, endpoint_url: str | None = None
) -> Output:
    """The output for a writer's target: an object-store url or a local directory. Any
    other ``scheme://`` is an error, never a directory named after it."""
    if is_object_url(target):
        return ObjectOutput(str(target), manifest, endpoint_url=endpoint_url)
    text = os.fspath(target)
    if isinstance(text, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise ConfigError(
            f"{text!r}: a writer writes to a local directory or to s3://, gs:// or az://; "
            "not to this scheme"
        )
    return LocalOutput(str(text), manifest)


def local_target(target: str | os.PathLike[str], what: str) -> str:
    """``target`` as a local directory path for ``what`` (a build, a merge, a sink), which
    writes only locally for now: a url is an error saying what does stream into an object
    store, never a directory named after the scheme."""
    text = os.fspath(target)
    if isinstance(text, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        hint = (
            "sk.ShardWriter(url) streams shards into s3://, gs:// and az:// today; "
            if is_object_url(text)
            else ""
        )
        raise ConfigError(
            f"{text!r}: {what} writes to a local directory ({hint}write locally and copy, "
            "or use a shared file system)"
        )
    return str(text)
