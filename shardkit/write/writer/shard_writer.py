"""ShardWriter: pack samples into WebDataset-format tar shards plus a checksum manifest.

Each shard is written to a temporary name in the output directory, checksummed as its
bytes go out (no second read), fsynced and renamed; its sample index is written beside it,
then its entry is appended to a journal (``.manifest.json.journal``, one JSON line, fsynced):
a flat cost per shard, where rewriting the whole manifest after every shard made a build
quadratic in its shard count. The journal is folded into the manifest (written atomically)
at close, on resume, and whenever it has grown as long as the manifest (so rewrites cost
O(shards) in all). At any instant manifest and journal list only whole shards. A ``with``
block that raises finishes no shard: the one being written is deleted. Where the bytes go (a
local directory, an object-store prefix) is the target's business
(:mod:`shardkit.write.writer.target`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from shardkit.errors import ConfigError, WriterError
from shardkit.format.checksum import new_hasher
from shardkit.format.layout import index_name as shard_index_name
from shardkit.format.manifest.model import Manifest, ShardEntry, creation_info
from shardkit.format.tario.writer import (
    END_OF_ARCHIVE,
    check_key,
)
from shardkit.write.writer.members import encode_sample
from shardkit.write.writer.options import WriterKeywords, WriterOptions, shard_name
from shardkit.write.writer.shard_bytes import ShardBytes
from shardkit.write.writer.target import Lock, Target, store_failures
from shardkit.write.writer.where import open_target

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only annotations use it

__all__ = ["ShardWriter"]

log = logging.getLogger(__name__)


class ShardWriter:
    """Write samples into size- and/or count-limited tar shards with a manifest.

    Args:
        out_dir: directory for shards and ``manifest.json`` / ``manifest.csv`` (or the
            :class:`~shardkit.write.writer.target.Target` a build chose).
        manifest: the manifest file name inside ``out_dir``.
        start_index: the number of the first shard.
        resume: keep the shards an existing manifest in ``out_dir`` lists and continue
            after them (see :attr:`resumed_samples` for how many samples to skip).
        overwrite: replace the data set ``out_dir`` holds (its manifest, the shards it
            lists and this prefix's shards are deleted first; in an object store the
            manifest goes first). Without it, or ``resume``, a local directory holding a
            manifest of this name is refused.
        part: ``(i, n)`` marks the manifest as part ``i`` of ``n`` for a later merge.
        keywords: how shards are cut, named and checked, by keyword (``maxcount=100``:
            :class:`WriterOptions`' fields prefix, maxsize, maxcount, checksum, compress,
            piece_size, image_quality), made one frozen value (:attr:`options`).
        endpoint_url: the S3-compatible endpoint for an ``s3://`` ``out_dir``.

    ``out_dir`` may be an object-store url (``s3://bucket/prefix/``, ``gs://...``,
    ``az://container/...``): shards are streamed up as they are written, each appears only
    when whole, the manifest goes last and ``resume=True`` goes on from what is verifiably
    there (:mod:`shardkit.write.writer.objects`). Any other ``scheme://`` is an error.

    One writer per output: the writer locks its manifest name and shard prefix in
    ``out_dir`` (:mod:`shardkit.write.writer.lock`, in a store
    :mod:`shardkit.write.writer.object_lock`) until it is closed; a second writer (or build)
    there, from any thread or process, is a :class:`WriterError` naming the holder. The
    lock is this writer's: one dropped unclosed (collected) lets it go.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | Target,
        *misplaced: object,
        manifest: str = "manifest.json",
        start_index: int = 0,
        resume: bool = False,
        overwrite: bool = False,
        part: tuple[int, int] | None = None,
        endpoint_url: str | None = None,
        **keywords: Unpack[WriterKeywords],
    ) -> None:
        self.out_dir = out_dir.base if isinstance(out_dir, Target) else os.fspath(out_dir)
        if "%" in os.path.basename(self.out_dir) and ".tar" in os.path.basename(self.out_dir):
            raise ConfigError(
                f"{self.out_dir!r} looks like a webdataset shard pattern: ShardWriter takes "
                "the output directory and a prefix (ShardWriter(out_dir, prefix='data'))"
            )
        if misplaced:  # ShardWriter(out, "data") or a WriterOptions: one spelling, keywords
            raise ConfigError(
                f"ShardWriter takes its options by keyword, not {misplaced[0]!r}: "
                "ShardWriter(out_dir, prefix='data', maxsize='1GB', maxcount=...)"
            )
        if resume and overwrite:
            raise ConfigError("resume and overwrite exclude each other: pick one")
        opts = WriterOptions().with_keywords(dict(keywords))
        self.options = opts
        self.prefix = opts.prefix
        self.maxsize = opts.max_bytes
        self.maxcount = opts.maxcount
        self.algo = opts.checksum
        self.compress = opts.compress
        self.piece_size = opts.piece_bytes
        self.image_quality = opts.image_quality
        self.output = open_target(out_dir, manifest, endpoint_url=endpoint_url)
        if not isinstance(out_dir, Target) and not manifest.endswith(".json"):
            # its CSV ({stem}.csv) was written over it ('m.csv'), and a reader takes a
            # manifest by its .json name ('m' was read as a shard)
            raise ConfigError(f"manifest {manifest!r} is not a .json name: name it *.json")
        self.manifest_path = self.output.manifest_path
        names = (self.output.manifest_name, f"{self.prefix}-shards")
        self._lock: Lock | None = None
        # a store's refusal (no bucket, no credentials) is one line naming the url
        with store_failures(self.output.base):
            # held by this writer, not its thread: dropped unclosed, it lets the output go
            self._lock = self.output.lock(names, owner=self)
            if self._lock is not None:
                self._lock.acquire()
            try:
                self._start(start_index, resume, overwrite, part)
            except BaseException:
                self._unlock()
                raise

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _start(
        self, start_index: int, resume: bool, overwrite: bool, part: tuple[int, int] | None
    ) -> None:
        """Under the lock: check what the output holds, then set up the first shard."""
        if overwrite:
            self.output.remove_existing(self.prefix)
        elif not resume:
            self.output.refuse_existing(self.prefix, first=start_index if part else None)
        self.manifest = Manifest(
            checksum_algorithm=self.algo,
            created=creation_info(),
            part={"index": part[0], "count": part[1]} if part else None,
            base=self.output.base,
        )
        self.next_index = start_index
        self.resumed_samples = 0
        self.output.prepare(self.prefix)
        self._folded = 0  # shards the manifest there lists
        if resume:
            self._load_existing()
        else:  # what another run journalled here is not this build's
            self.output.forget_journal()
        self._shard: ShardBytes | None = None  # the shard being written
        self._closed = False
        self._good_fields: set[str] = set()  # field names already checked

    # -- public --------------------------------------------------------------------
    @property
    def shards(self) -> list[ShardEntry]:
        """The finished shards so far."""
        return self.manifest.shards

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample: ``{"__key__": key, field: value, ...}``.

        Fields whose name starts with ``__`` are metadata and not written. A sample that
        raises :class:`WriterError` (bad key or field, a value its codec cannot encode, a
        key already in this shard) leaves the writer as it was. A key that starts with
        ``./`` is written without it: the key a reader gives back.
        """
        if self._closed:
            raise WriterError("write() on a closed ShardWriter")
        key = check_key(sample.get("__key__"))  # type: ignore[arg-type]
        pieces, size, sizes = encode_sample(str(key), sample, self._good_fields, self.image_quality)
        if self._shard is not None and (
            self._shard.offset + size + len(END_OF_ARCHIVE) > self.maxsize
            or (self.maxcount is not None and len(self._shard.offsets) >= self.maxcount)
        ):
            with self._disk():
                self._finish_shard()
        if self._shard is not None and key in self._shard.keys:
            raise WriterError(f"sample key {key!r} appears twice in shard {self._shard_name()}")
        if self._shard is None:
            with self._disk():
                self._open_shard()
        shard = self._shard
        assert shard is not None
        shard.add(str(key), pieces, size, sizes)
        if shard.due:
            with self._disk():
                shard.flush()

    def next_shard(self) -> None:
        """Finish the shard being written now (if any); the next sample starts a new one."""
        if self._shard is not None:
            with self._disk():
                self._finish_shard()

    def close(self) -> Manifest:
        """Finish the open shard and write the final manifest; return it."""
        if not self._closed:
            with self._disk():
                if self._shard is not None:
                    self._finish_shard()
                self._write_manifest()
            self._closed = True
            self._unlock()
        return self.manifest

    @contextlib.contextmanager
    def _disk(self) -> Iterator[None]:
        """A failed write (a full disk, a file size limit) as a WriterError: the shard
        being written is dropped by ``abort`` and the manifest lists whole shards only."""
        try:
            with store_failures(self.output.base):
                yield
        except OSError as exc:
            raise WriterError(
                f"{self.out_dir}: writing shard {self._shard_name()} failed: "
                f"{exc.strerror or exc}; the manifest lists only the "
                f"{len(self.manifest.shards)} whole shards written before it"
            ) from exc

    def abort(self) -> None:
        """Drop the shard being written (its temp file or upload) and keep the finished ones."""
        try:
            self.output.drop(self._shard.file if self._shard is not None else None)
        finally:
            self._shard = None  # its pending bytes with it
        if not self._closed:
            self._closed = True
            try:
                if self.manifest.shards or not self.output.has_manifest():
                    self._write_manifest()
            except OSError as exc:  # the disk is still full: the last manifest stands
                log.info("%s: cannot rewrite the manifest: %r", self.out_dir, exc)
                self._drop_unfolded()
            finally:
                self._unlock()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- shards --------------------------------------------------------------------
    def _shard_name(self) -> str:
        return shard_name(self.prefix, self.next_index, self.compress)

    def _open_shard(self) -> None:
        self._shard = ShardBytes(
            self.output.open_shard(self._shard_name()),
            algo=self.algo,
            piece_size=self.piece_size,
            compress=self.compress,
        )

    def _finish_shard(self) -> None:
        shard = self._shard
        assert shard is not None
        checksum, index_bytes = shard.finish()
        name = self._shard_name()
        index_name = shard_index_name(name)
        index_hash = new_hasher(self.algo)
        index_hash.update(index_bytes)
        sink, self._shard = shard.file, None
        self.output.publish(sink, name, index_name, index_bytes)
        digest = shard.hashing.digest
        entry = ShardEntry(
            url=name,
            size=digest.size,
            nsamples=len(shard.offsets),
            checksum=checksum,
            index=index_name,
            index_checksum=f"{self.algo}:{index_hash.hexdigest()}",
            pieces=digest.pieces.result() if digest.pieces else None,
        )
        line = {"shard": entry.to_dict(), "fields": shard.fields}
        self._journal_or_undo(name, json.dumps(line, separators=(",", ":")).encode() + b"\n")
        self.manifest.shards.append(entry)
        for field, st in shard.fields.items():
            acc = self.manifest.fields.setdefault(field, {"count": 0, "bytes": 0})
            acc["count"] += st["count"]
            acc["bytes"] += st["bytes"]
        self.next_index += 1
        if len(self.manifest.shards) >= 2 * self._folded:
            self._write_manifest()
        log.debug("finished shard %s: %d samples, %d bytes", name, entry.nsamples, entry.size)

    def _journal_or_undo(self, name: str, line: bytes) -> None:
        """Journal a finished shard; if that fails (a full disk), a local shard and its
        index go again, so no shard lies there that no manifest or journal lists."""
        try:
            self.output.append_journal(name, line)
        except OSError:
            self.output.undo_shard(name)
            raise

    def _drop_unfolded(self) -> None:
        """The manifest on a local disk is the last word (it could not be rewritten): the
        shards only the journal lists go, and the journal, so every shard there is listed
        (a resume writes them again)."""
        if self.output.drop_unfolded(self.manifest.shards[self._folded :]):
            del self.manifest.shards[self._folded :]

    def _write_manifest(self) -> None:
        """Fold the journal into the manifest: write it whole, then drop the journal."""
        self.output.write_manifest(self.manifest)
        self._folded = len(self.manifest.shards)

    def _load_existing(self) -> None:
        found = self.output.resumable(self.algo)
        if found is None:
            return
        if found.listed is not None:
            self.manifest.created = dict(found.manifest.created)  # the build's fingerprint stays
        self._folded = found.listed or 0  # what the manifest there lists
        self.manifest.shards = list(found.manifest.shards)
        self.manifest.fields = found.manifest.fields
        self.resumed_samples = found.manifest.total_samples
        self.next_index += len(found.manifest.shards)
        if found.journalled:
            self._write_manifest()
