"""One pass over a shard: everything a manifest and a sample index need, read once.

:func:`scan_shard` (a path) and :func:`scan_stream` (a stream at a shard's first byte) read a
shard once and get, in that one pass: size, checksum (hashed as the bytes are read), piece
checksums, sample count and each sample's byte offset and signature, each sample's digest
(:class:`DigestingReader`, which ``verify --deep`` uses too), field statistics and the
first keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from shardkit.errors import ShardFormatError
from shardkit.format.checksum import new_hasher
from shardkit.format.compression import open_tar
from shardkit.format.digest import Digest, HashingReader
from shardkit.format.manifest.model import FieldStats, ShardEntry
from shardkit.format.pieces import Pieces
from shardkit.format.tario.index import SampleDigester, sample_signature, write_index
from shardkit.format.tario.reader import TarReader

__all__ = ["DigestingReader", "ShardScan", "scan_shard", "scan_stream"]

# the largest sample a scan digests for the index (its bytes are held until its end is
# known); a larger one is read as a stream by a lookup (lookup.DIRECT_MAX) in any case
_HOLD = 64 << 20


@dataclass
class ShardScan:
    """One pass over a shard: ``offsets`` of its samples and ``end`` (the end-of-archive
    offset; both in the decompressed tar for ``.tar.zst``), its on-disk ``size`` and
    ``checksum``, per-field ``{"count", "bytes"}`` and the first few keys.
    """

    path: str
    size: int
    checksum: str
    offsets: list[int]
    end: int
    fields: FieldStats = field(default_factory=dict)
    first_keys: list[str] = field(default_factory=list)
    pieces: Pieces | None = None
    signatures: list[int] = field(default_factory=list)  # per sample, for the index
    digests: list[int] | None = None  # per sample (None: one too large to hold), for the index
    skipped: dict[str, int] = field(default_factory=dict)  # members passed over, by kind

    @property
    def nsamples(self) -> int:
        return len(self.offsets)

    def index(self, algo: str) -> tuple[bytes, str]:
        """The shard's sample index (the current form, SKIDX003, bound and with each
        sample's digest; SKIDX002 where a sample was too large to digest in the scan) and
        its checksum as ``algo:hex``."""
        data = write_index(
            self.offsets,
            self.end,
            signatures=self.signatures,
            shard_checksum=self.checksum,
            digests=self.digests,
        )
        h = new_hasher(algo)
        h.update(data)
        return data, f"{algo}:{h.hexdigest()}"

    def entry(self, url: str, index: str | None, index_checksum: str | None) -> ShardEntry:
        """The manifest's entry for the shard at ``url`` (its index at ``index``)."""
        return ShardEntry(
            url, self.size, self.nsamples, self.checksum, index, index_checksum, self.pieces
        )


class DigestingReader:
    """A stream over a tar (from its first byte) that digests each sample's bytes
    ``[off[i], off[i+1])`` (:func:`~shardkit.format.tario.index.sample_digest`) as the scan
    finds where samples start (:meth:`start`): the bytes read since the last start are
    held until the next is known, so a sample larger than ``hold`` bytes stops the digests
    (:attr:`digests` None; its index is then written without them) and memory stays
    bounded."""

    def __init__(self, f: BinaryIO, hold: int | None = None) -> None:
        self.f = f
        self.hold = _HOLD if hold is None else hold
        self.held: list[bytes] = []
        self.held_at = 0  # the tar offset of held[0][0]
        self.held_size = 0
        self.open: int | None = None  # where the sample being held began
        self.digests: list[int] | None = []

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if self.digests is not None and data:
            self.held.append(data)
            self.held_size += len(data)
            if self.held_size > self.hold:
                self.digests = None  # a sample too large to hold: no digests
                self.held = []
        if self.digests is None:
            self.held_at += len(data)
            self.held_size = 0
        return data

    def seekable(self) -> bool:
        return False  # every byte goes through read()

    @property
    def checked_at_end(self) -> bool:
        """Whether the stream below checks itself at its end (a decompressor: the tar
        reader reads it to its end, :meth:`~shardkit.format.tario.buffer.Buffered.finish`)."""
        return bool(getattr(self.f, "checked_at_end", False))

    def start(self, at: int) -> None:
        """A sample (or, at the end, the end-of-archive marker) starts at byte ``at``."""
        if self.digests is None:
            return
        head = self._take(at)
        if self.open is not None:
            h = SampleDigester()
            for part in head:
                h.update(part)
            self.digests.append(h.digest())
        self.open = at

    def _take(self, at: int) -> list[memoryview]:
        """The held bytes before ``at`` (dropped from what is held)."""
        out: list[memoryview] = []
        while self.held and self.held_at < at:
            part = self.held[0]
            if self.held_at + len(part) <= at:
                out.append(memoryview(part))
                self.held.pop(0)
                self.held_at += len(part)
                self.held_size -= len(part)
            else:
                cut = at - self.held_at
                out.append(memoryview(part)[:cut])
                self.held[0] = part[cut:]
                self.held_at, self.held_size = at, self.held_size - cut
        return out


def _scan_tar(
    f: BinaryIO, url: str, size: int | None, nkeys: int, policy: str
) -> tuple[tuple[Any, ...], list[int] | None]:
    tee = DigestingReader(f)
    reader = TarReader(tee, url=url, size=size, keep_data=False, policy=policy)  # type: ignore[arg-type]
    offsets: list[int] = []
    stats: FieldStats = {}
    keys: list[str] = []
    sigs: list[int] = []
    for offset, sample in reader.samples():
        tee.start(offset)
        offsets.append(offset)
        key = str(sample.pop("__key__"))
        if len(keys) < nkeys:
            keys.append(key)
        sigs.append(sample_signature(key, sample))
        for fld, data in sample.items():
            st = stats.setdefault(fld, {"count": 0, "bytes": 0})
            st["count"] += 1
            st["bytes"] += data
    end = reader.end_offset if reader.end_offset is not None else reader.offset
    tee.start(end)
    skipped = {k: n for k, n in reader.skipped.items() if k != "directory"}
    return (offsets, end, stats, keys, sigs, skipped), tee.digests


def scan_shard(
    path: str,
    *,
    algo: str = "sha256",
    nkeys: int = 5,
    url: str | None = None,
    progress: Callable[[int], object] | None = None,
    piece_size: int | None = None,
    tar_policy: str = "strict",
) -> ShardScan:
    """Read the shard at ``path`` once: checksum, sample offsets, field stats, first keys
    (and with ``piece_size`` the checksums of its pieces, hashed in the same pass).

    Raises :class:`ShardFormatError` (naming the shard and byte offset) for a tar that is
    truncated, corrupt or hostile. ``progress(nbytes)`` is called as bytes are read.
    ``tar_policy="lenient"`` skips links, devices, FIFOs and unknown member types
    (counted in :attr:`ShardScan.skipped`, warned naming the shard).
    """
    name = url or path
    try:
        raw = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ShardFormatError(f"cannot open shard: {exc.strerror}", url=name) from exc
    with raw:
        size = os.fstat(raw.fileno()).st_size
        scan = scan_stream(raw, name, algo=algo, nkeys=nkeys, progress=progress,
                           piece_size=piece_size, size=size, tar_policy=tar_policy)  # fmt: skip
    scan.path = path
    return scan


def scan_stream(
    raw: BinaryIO,
    name: str,
    *,
    algo: str = "sha256",
    nkeys: int = 5,
    progress: Callable[[int], object] | None = None,
    piece_size: int | None = None,
    size: int | None = None,
    tar_policy: str = "strict",
) -> ShardScan:
    """:func:`scan_shard` of a stream positioned at a shard's first byte (a remote shard);
    ``size`` is its size when known."""
    src = HashingReader(raw, Digest(algo, piece_size, progress))
    with open_tar(src, url=name) as (tar, kind):  # type: ignore[arg-type]
        found, digests = _scan_tar(tar, name, size if kind is None else None, nkeys, tar_policy)
    src.drain()
    offsets, end, stats, keys, sigs, skipped = found
    checksum = src.digest.checksum()
    found_pieces = src.digest.pieces.result() if src.digest.pieces is not None else None
    return ShardScan(
        name, src.digest.size, checksum, offsets, end, stats, keys, found_pieces, sigs,
        digests, skipped,
    )  # fmt: skip
