"""A local folder as a writer's or a build's target (:mod:`shardkit.write.writer.target`).

A shard goes to a temp name, is fsynced and renamed; the journal is one file of fsynced
lines; the manifest (with its CSV and compact form) is written atomically. A lone writer
and a build lock the folder with ``flock`` (:mod:`shardkit.write.writer.lock`). A parallel
build keeps its work in ``.{stem}/`` (``build.json``, one folder per worker, and
``finalize.json``: the join's renames, planned before the first one, so a crash half-way
is finished by ``--resume``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from shardkit.durable import atomic_write
from shardkit.errors import ManifestError
from shardkit.format.layout import INDEX_DIR, index_name
from shardkit.format.manifest.compact import compact_path, save_manifest
from shardkit.format.manifest.journal import journal_path, read_journal
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.write.writer.lock import OutputLock, pid_alive
from shardkit.write.writer.target import ErrorLog, Existing, Moves, Target, errors_name

__all__ = ["LocalTarget"]


def _shard_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-\d{{6,}}\.tar(?:\.zst|\.gz)?(?:\.idx)?$")


def _writing(pid: int) -> bool:
    """Whether a shard's temp file of ``pid`` may be a live writer's, to one that holds the
    prefix's lock: not this process's (a writer of it dropped unclosed left it)."""
    return pid != os.getpid() and pid_alive(pid)


class LocalTarget(Target):
    """A local folder (module docstring)."""

    def __init__(self, out_dir: str, manifest: str = "manifest.json") -> None:
        self.out_dir = out_dir
        self.base = os.path.abspath(out_dir)
        self.manifest_name = manifest
        self.manifest_path = os.path.join(out_dir, manifest)
        self._journal: BinaryIO | None = None
        self._tmp: dict[int, str] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalTarget, (self.out_dir, self.manifest_name))

    # -- the place -----------------------------------------------------------------
    def sibling(self, manifest: str) -> LocalTarget:
        return LocalTarget(self.out_dir, manifest)

    def worker(self, stem: str, tag: str, prefix: str) -> tuple[Target, str]:
        return LocalTarget(os.path.join(self.base, f".{stem}", tag)), prefix

    def put(self, rel: str, data: bytes) -> None:
        path = os.path.join(self.base, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, data)

    # -- shards and indexes --------------------------------------------------------
    def prepare(self, prefix: str) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        mine = re.compile(rf"^\.{re.escape(prefix)}-\d{{6,}}\.tar(?:\.zst|\.gz)?\.tmp-(\d+)$")
        stem = re.escape(os.path.splitext(self.manifest_name)[0])
        ours = re.compile(rf"^\.tmp-\w+-{stem}\.(?:json|json\.cols|csv)$")
        for name in os.listdir(self.out_dir):
            m = mine.match(name)
            if (m is not None and not _writing(int(m.group(1)))) or ours.match(name):
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
        self.put(index_name, index)  # the .index/ folder
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

    def undo_shard(self, name: str) -> None:
        for path in (name, index_name(name)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.out_dir, path))

    def check_shard(self, entry: ShardEntry, tag: str | None) -> str | None:
        del tag
        try:
            size = os.path.getsize(os.path.join(self.out_dir, entry.url))
        except OSError:
            size = -1
        return None if size == entry.size else f"is missing or has {size} bytes, not {entry.size}"

    # -- journal and manifest ------------------------------------------------------
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
        os.makedirs(self.out_dir or ".", exist_ok=True)
        save_manifest(manifest, self.manifest_path)
        self.forget_journal()

    def existing(self) -> Existing:
        journal = read_journal(self.manifest_path)
        return self.read_manifest(), journal

    def has_manifest(self) -> bool:
        return os.path.exists(self.manifest_path)

    def read_manifest(self) -> Manifest | None:
        path = self.manifest_path
        return Manifest.load(path) if os.path.exists(path) else None

    def shard_names(self, prefix: str) -> list[str]:
        mine = _shard_pattern(prefix)
        names = os.listdir(self.out_dir) if os.path.isdir(self.out_dir) else []
        return sorted(n for n in names if mine.match(n) and not n.endswith(".idx"))

    def remove_existing(self, prefix: str, *, worker_names: bool = False) -> int:
        """Delete the manifest (and its csv, compact form, journal), the shards and indexes
        it lists in its own folder, and the shards of ``prefix`` there."""
        del worker_names  # a local parallel build's workers write in its work folder
        path = self.manifest_path
        out_dir = os.path.dirname(path) or "."
        real_dir = os.path.realpath(out_dir)
        doomed: set[str] = set()
        with contextlib.suppress(FileNotFoundError, ManifestError):
            for s in Manifest.load(path).shards:
                for url in (s.url, s.index):
                    p = os.path.realpath(os.path.join(out_dir, url or ""))
                    if url and os.path.dirname(p) in (real_dir, os.path.join(real_dir, INDEX_DIR)):
                        doomed.add(p)
        mine = _shard_pattern(prefix)
        for folder in (out_dir, os.path.join(out_dir, INDEX_DIR)):
            if os.path.isdir(folder):
                doomed.update(os.path.join(folder, n) for n in os.listdir(folder) if mine.match(n))
        stem = os.path.splitext(path)[0]
        doomed.update((path, stem + ".csv", compact_path(path), journal_path(path)))
        removed = 0
        for p in sorted(doomed):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
                removed += 1
        return removed

    def drop_unfolded(self, entries: Sequence[ShardEntry]) -> bool:
        for entry in entries:
            for url in (entry.url, entry.index):
                if url:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.out_dir, url))
        with contextlib.suppress(OSError):
            self.forget_journal()
        return True

    # -- report --------------------------------------------------------------------
    def _report_path(self) -> str:
        return os.path.join(self.out_dir, errors_name(self.manifest_name))

    def error_log(self) -> ErrorLog:
        os.makedirs(self.out_dir, exist_ok=True)
        return ErrorLog(self._report_path())

    def join_reports(self, sources: Sequence[Target]) -> None:
        logs = [p for p in (_report_of(s) for s in sources) if os.path.exists(p)]
        out = self._report_path()
        if not logs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out)
            return

        def chunks() -> Iterator[bytes]:
            for p in logs:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 20):
                        yield chunk

        atomic_write(out, chunks())

    # -- lock ----------------------------------------------------------------------
    def lock(self, names: Sequence[str], *, owner: object | None = None) -> OutputLock:
        return OutputLock(self.out_dir, names, via=self, owner=owner)

    # -- a parallel build's work state ---------------------------------------------
    def work_name(self, stem: str) -> str:
        return os.path.join(self.base, f".{stem}")

    def _state_path(self, stem: str) -> str:
        return os.path.join(self.work_name(stem), "build.json")

    def work_state(self, stem: str) -> dict[str, Any] | None:
        path = self._state_path(stem)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            loaded: dict[str, Any] = json.load(f)
        return loaded

    def has_work(self, stem: str) -> bool:
        return os.path.exists(self.work_name(stem))

    def begin_work(self, stem: str, meta: dict[str, Any]) -> bool:
        os.makedirs(self.work_name(stem), exist_ok=True)
        if not os.path.exists(self._state_path(stem)):
            atomic_write(self._state_path(stem), json.dumps(meta).encode())
        return os.path.exists(os.path.join(self.work_name(stem), "finalize.json"))

    def drop_work(self, stem: str, *, shards: str | None = None) -> None:
        del shards  # the workers' shards lie in the work folder
        shutil.rmtree(self.work_name(stem), ignore_errors=True)

    # -- clear and join ------------------------------------------------------------
    def doomed(self, prefix: str) -> list[str]:
        """This prefix's shards and indexes, the manifest, its CSV and report."""
        out = self.base
        if not os.path.isdir(out):
            return []
        shard = _shard_pattern(prefix)
        stem = os.path.splitext(self.manifest_name)[0]
        mine = {self.manifest_name, stem + ".csv", stem + ".errors.jsonl"}
        found = [
            os.path.join(out, n) for n in sorted(os.listdir(out)) if n in mine or shard.match(n)
        ]
        indexes = os.path.join(out, INDEX_DIR)
        if os.path.isdir(indexes):
            found += [
                os.path.join(indexes, n) for n in sorted(os.listdir(indexes)) if shard.match(n)
            ]
        return found

    def clear(self, prefix: str, stem: str) -> int:
        removed = 0
        for path in self.doomed(prefix):
            os.unlink(path)
            removed += 1
        if os.path.isdir(self.work_name(stem)):
            shutil.rmtree(self.work_name(stem))
        return removed

    def saved_join(self, stem: str) -> tuple[Manifest, Moves] | None:
        fin = os.path.join(self.work_name(stem), "finalize.json")
        if not os.path.exists(fin):
            return None
        with open(fin, encoding="utf-8") as f:
            saved = json.load(f)
        return Manifest.from_dict(saved["manifest"]), [(a, b) for a, b in saved["moves"]]

    def place_shards(
        self, worker: Target, shards: Sequence[ShardEntry], name: Callable[[int], str]
    ) -> tuple[list[ShardEntry], Moves]:
        """Renamed into one sequence, indexes beside them."""
        out: list[ShardEntry] = []
        moves: Moves = []
        for i, s in enumerate(shards):
            to = name(i)
            moves.append((os.path.join(worker.base, s.url), os.path.join(self.base, to)))
            index = None
            if s.index:
                index = index_name(to)
                moves.append((os.path.join(worker.base, s.index), os.path.join(self.base, index)))
            out.append(dataclasses.replace(s, url=to, index=index))
        return out, moves

    def commit_join(self, stem: str, manifest: Manifest, moves: Moves) -> None:
        """The renames, planned into ``finalize.json`` first (a rename whose source is gone
        was done before a crash)."""
        fin = os.path.join(self.work_name(stem), "finalize.json")
        if not os.path.exists(fin):
            doc = {"manifest": manifest.to_dict(), "moves": moves}
            os.makedirs(os.path.dirname(fin), exist_ok=True)
            atomic_write(fin, json.dumps(doc).encode())
        for src, dst in moves:
            if os.path.exists(src):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.replace(src, dst)


def _report_of(t: Target) -> str:
    return os.path.join(t.base, errors_name(t.manifest_name))
