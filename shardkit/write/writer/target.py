"""Where a writer or a build puts what it writes: one :class:`Target`, chosen once from the
url where the output arrives (:func:`~shardkit.write.writer.where.open_target`), a local folder
(:class:`~shardkit.write.writer.local.LocalTarget`) or an object-store prefix
(:class:`~shardkit.write.writer.objects.ObjectTarget`), and carried from there: the writer,
the build's plan, its workers, the join of their manifests and the Ray sink ask the target,
never the url.

A target answers for one manifest name in one place:

- shards and indexes: a shard appears whole or not at all (``open_shard``, ``publish``,
  ``drop``), is checked on resume (``check_shard``);
- the journal of finished shards and the manifest, written last (``append_journal``,
  ``write_manifest``, ``existing``);
- the report of skipped records beside the manifest (``error_log``, ``join_reports``);
- the lock that keeps a second writer or build out (``lock``);
- a parallel build's work state and its workers' own places (``begin_work``, ``worker``);
- ``clear`` (``--overwrite``) and the join's own step (``place_shards``, ``commit_join``).
"""

from __future__ import annotations

import contextlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol

from shardkit.errors import ConfigError, ManifestError, ShardkitError, WriterError
from shardkit.format.manifest.model import Manifest, ShardEntry, add_fields

if TYPE_CHECKING:
    from shardkit.write.inputs.sources import BadRecord

__all__ = [
    "ErrorLog",
    "Existing",
    "Lock",
    "Moves",
    "Resumable",
    "Target",
    "build_info",
    "errors_name",
    "store_failures",
]

Existing = tuple[Manifest | None, list[tuple[ShardEntry, dict[str, dict[str, int]]]]]
Moves = list[tuple[str, str]]
"""A local join's renames (source, destination); none in an object store."""

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


def build_info(m: Manifest | None) -> dict[str, Any]:
    """The ``created.build`` block a build leaves in its manifest (config, complete)."""
    info = m.created.get("build") if m is not None else None
    return info if isinstance(info, dict) else {}


def errors_name(manifest: str) -> str:
    """The skipped-records report beside a manifest: ``manifest.errors.jsonl``."""
    return os.path.splitext(manifest)[0] + ".errors.jsonl"


class Resumable(NamedTuple):
    """What a writer resumes from: the shards verifiably there (manifest and journal
    folded), how many the manifest listed (None: there was none), whether the journal
    added any."""

    manifest: Manifest
    listed: int | None
    journalled: bool


class Lock(Protocol):
    """A held-or-refused lock on an output (``acquire`` refuses naming the holder)."""

    def acquire(self) -> Lock: ...

    def release(self) -> None: ...

    def __enter__(self) -> Lock: ...

    def __exit__(self, *exc: Any) -> None: ...


class ErrorLog:
    """The report of skipped records: one JSON line each, created at the first one.

    A stale report is removed when a run starts: a resumed run reports every bad record
    again (it reads them again), so the report is always whole.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self.first: BadRecord | None = None  # what a message names
        self._f: Any = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def add(self, bad: BadRecord) -> None:
        if self._f is None:
            self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._f.write(json.dumps(bad.to_dict(), ensure_ascii=False) + "\n")
        self.count += 1
        self.first = self.first or bad

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class Target(ABC):
    """One manifest name in one place (the module docstring): what the writer and the build
    need of where they write."""

    base: str  # the folder's absolute path or the prefix's url, without a trailing "/"
    manifest_name: str
    manifest_path: str

    # -- the place -----------------------------------------------------------------
    @abstractmethod
    def sibling(self, manifest: str) -> Target:
        """This place with another manifest name."""

    @abstractmethod
    def worker(self, stem: str, tag: str, prefix: str) -> tuple[Target, str]:
        """The own place of worker ``tag`` of the work ``stem`` and its shard prefix."""

    @abstractmethod
    def put(self, rel: str, data: bytes) -> None:
        """Write a small file ``rel`` (relative to the place) whole."""

    # -- shards and indexes --------------------------------------------------------
    @abstractmethod
    def prepare(self, prefix: str) -> None:
        """Make the place ready and clear what dead writers of ``prefix`` left there."""

    @abstractmethod
    def open_shard(self, name: str) -> BinaryIO:
        """A sink for shard ``name``'s bytes (invisible under ``name`` until published)."""

    @abstractmethod
    def publish(self, sink: BinaryIO, name: str, index_name: str, index: bytes) -> str:
        """Make shard ``name`` (and its index) appear whole; a version tag of it."""

    @abstractmethod
    def drop(self, sink: BinaryIO | None) -> None:
        """Drop a shard being written: nothing of it appears."""

    def undo_shard(self, name: str) -> None:
        """A published shard whose journal entry failed goes again, where it can."""
        del name

    @abstractmethod
    def check_shard(self, entry: ShardEntry, tag: str | None) -> str | None:
        """None if shard ``entry`` is there whole, else what is wrong with it."""

    # -- journal and manifest ------------------------------------------------------
    @abstractmethod
    def append_journal(self, name: str, line: bytes) -> None:
        """Record finished shard ``name`` (one JSON line) durably."""

    @abstractmethod
    def forget_journal(self) -> None:
        """Drop the journal (folded into the manifest, or another run's)."""

    @abstractmethod
    def write_manifest(self, manifest: Manifest) -> None:
        """Write the manifest whole, last, and drop the journal."""

    @abstractmethod
    def existing(self) -> Existing:
        """The manifest there (or None) and the journal entries not folded into it."""

    def resumable(self, algo: str) -> Resumable | None:
        """The whole shards here a writer of ``algo`` goes on after (a ManifestError when
        one is missing or changed, or the algorithm differs), or None when there are none."""
        existing, journal = self.existing()
        if existing is None and not journal:
            return None
        old = existing or Manifest(checksum_algorithm=algo, base=self.base)
        listed = {e.url for e in old.shards}
        count = len(old.shards)
        for entry, fields in journal:
            if entry.url in listed:  # folded already: a kill came before the journal went
                continue
            old.shards.append(entry)
            add_fields(old.fields, fields)
        if old.checksum_algorithm != algo:
            raise ManifestError(
                f"cannot resume: existing shards use {old.checksum_algorithm}, this writer {algo}",
                path=self.manifest_path,
            )
        for i, s in enumerate(old.shards):
            wrong = self.check_shard(s, None)
            if wrong is not None:
                raise ManifestError(
                    f"cannot resume: shard {s.url} {wrong}", path=self.manifest_path, entry=i
                )
        return Resumable(old, count if existing is not None else None, bool(journal))

    @abstractmethod
    def has_manifest(self) -> bool: ...

    @abstractmethod
    def read_manifest(self) -> Manifest | None:
        """The manifest there, or None."""

    @abstractmethod
    def shard_names(self, prefix: str) -> list[str]:
        """The shards of ``prefix`` here (``PREFIX-NNNNNN.tar[.zst|.gz]``), sorted."""

    def refuse_existing(self, prefix: str, *, first: int | None = None) -> None:
        """A data set already here is not replaced by accident, in a folder or a store alike
        (it was: 300 samples became 1, the old shard left as a stray file; a store's set was
        replaced whole), nor shards of ``prefix`` that another manifest lists (a writer of
        ``val.json`` took ``data-000000.tar`` of ``manifest.json``'s set): a ConfigError
        naming the ways out. A part's writer (``first``: its first shard's number) is refused
        only the name it writes first: sibling parts share a folder, each its own numbers."""
        if not self.has_manifest():
            taken = self.shard_names(prefix)
            if first is not None:
                own = f"{prefix}-{first:06d}."
                taken = [n for n in taken if n.startswith(own)]
            if taken:
                raise ConfigError(
                    f"{self.base} already holds {len(taken)} shards named {prefix}-NNNNNN "
                    f"({taken[0]}, ...: another data set's, or a stopped writer's) that "
                    f"{self.manifest_name} does not list: pass overwrite=True to replace them, "
                    "resume=True to go on from them, or give another prefix"
                )
            return
        try:
            old = self.read_manifest()
            what = f"{len(old)} shards, {old.total_samples} samples" if old else "gone"
        except ManifestError as exc:
            what = f"unreadable: {exc}"
        where = os.path.dirname(self.manifest_path) or "."
        raise ConfigError(
            f"{where} already holds a data set ({self.manifest_path}: {what}): pass "
            "overwrite=True to replace it, resume=True to add to it, or use another directory"
        )

    @abstractmethod
    def remove_existing(self, prefix: str, *, worker_names: bool = False) -> int:
        """``overwrite``: delete the data set here and the shards of ``prefix``; how many."""

    def drop_unfolded(self, entries: Sequence[ShardEntry]) -> bool:
        """The manifest could not be rewritten: drop the shards only the journal lists
        (where the manifest is the last word); True if they were dropped."""
        del entries
        return False

    # -- report --------------------------------------------------------------------
    @abstractmethod
    def error_log(self) -> ErrorLog:
        """The report of skipped records beside the manifest, started empty."""

    @abstractmethod
    def join_reports(self, sources: Sequence[Target]) -> None:
        """The reports of ``sources`` (in order) as this manifest's one report (none: none)."""

    # -- lock ----------------------------------------------------------------------
    @abstractmethod
    def lock(self, names: Sequence[str], *, owner: object | None = None) -> Lock | None:
        """The lock of ``names`` (a manifest name, a shard prefix) here (None where none is
        taken). ``owner``: the lone writer holding it, which lends it to nothing and lets it
        go when collected unclosed; without one, a build's, held by this target and lent to
        the writer the build opens on it."""

    # -- a parallel build's work state ---------------------------------------------
    @abstractmethod
    def work_name(self, stem: str) -> str:
        """Where the work ``stem`` lies, for messages."""

    @abstractmethod
    def work_state(self, stem: str) -> dict[str, Any] | None:
        """The facts an unfinished parallel build recorded (its fingerprint), or None."""

    @abstractmethod
    def has_work(self, stem: str) -> bool:
        """Whether an unfinished parallel build left its work here."""

    @abstractmethod
    def begin_work(self, stem: str, meta: dict[str, Any]) -> bool:
        """Record the build's facts before its workers start; True if every worker had
        finished and only the join was left."""

    @abstractmethod
    def drop_work(self, stem: str, *, shards: str | None = None) -> None:
        """Delete the work ``stem`` (its state last); with ``shards``, the workers' shards
        of that prefix too (a failed job)."""

    # -- clear and join ------------------------------------------------------------
    @abstractmethod
    def clear(self, prefix: str, stem: str) -> int:
        """A build's ``overwrite``: what an earlier build of ``prefix`` left; how many."""

    def doomed(self, prefix: str) -> list[str]:
        """The local files :meth:`clear` deletes (none in a store)."""
        del prefix
        return []

    def saved_join(self, stem: str) -> tuple[Manifest, Moves] | None:
        """The join planned before a crash (local renames), or None."""
        del stem
        return None

    @abstractmethod
    def place_shards(
        self, worker: Target, shards: Sequence[ShardEntry], name: Callable[[int], str]
    ) -> tuple[list[ShardEntry], Moves]:
        """Worker ``worker``'s shards as the joined manifest lists them (``name(i)``: the
        name of its ``i``-th shard there) and the moves that make it true."""

    def commit_join(self, stem: str, manifest: Manifest, moves: Moves) -> None:
        """Carry out a join's moves (planned first where a crash could cut them)."""
        del stem, manifest, moves
