"""One shard's bytes as they are written: its tar stream, and what its index says of it.

:class:`ShardBytes` is what a :class:`~shardkit.write.writer.shard_writer.ShardWriter` holds
between a shard's first sample and its publication: the samples' tar pieces (small ones
joined, the rest as they are) going out through the shard's checksum (compressed as
asked), each sample's offset, signature and digest for the sample index, the keys in the
shard and each field's count and bytes. When a shard is cut, where it goes and what the
manifest says of the data set stay the writer's.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from shardkit.format.digest import Digest, HashingWriter
from shardkit.format.tario.index import SampleDigester, sample_signature, write_index
from shardkit.format.tario.writer import END_OF_ARCHIVE
from shardkit.format.zstd import zstd_writer
from shardkit.write.writer.members import gzip_writer

__all__ = ["ShardBytes"]

_FLUSH = 4 << 20  # pending bytes this many are due to be written out
# a piece of a member (header, data, padding) this large goes out as it is; runs of smaller
# ones are joined (one copy of small bytes, where a syscall and a hash call each would cost more)
_JOIN_BELOW = 64 << 10


class ShardBytes:
    """The shard being written into ``file`` (see the module docstring).

    Args:
        file: where its bytes go (the target's temporary file or upload).
        algo: the checksum algorithm of the shard.
        piece_size: bytes a piece checksum covers, or None for none.
        compress: None, ``"zstd"`` or ``"gzip"``: the whole shard's compression.
    """

    def __init__(
        self, file: BinaryIO, *, algo: str, piece_size: int | None, compress: str | None
    ) -> None:
        self.file = file
        self.hashing = HashingWriter(file, Digest(algo, piece_size))
        self._compressed = bool(compress)
        self._sink: Any
        if compress == "zstd":
            self._sink = zstd_writer(self.hashing)  # type: ignore[arg-type]
        elif compress == "gzip":
            self._sink = gzip_writer(self.hashing)
        else:
            self._sink = self.hashing
        self.pending: list[bytes | bytearray | memoryview] = []
        self.pending_size = 0
        self.offset = 0  # uncompressed bytes written to the shard
        self.offsets: list[int] = []
        self.sigs: list[int] = []  # each sample's index signature (key and fields)
        self.digests: list[int] = []  # each sample's digest (its bytes) for the index
        self.keys: set[str] = set()
        self.fields: dict[str, dict[str, int]] = {}  # joins manifest.fields when whole

    def add(
        self,
        key: str,
        pieces: list[bytes | bytearray | memoryview],
        size: int,
        sizes: dict[str, int],
    ) -> None:
        """Add one sample's tar pieces (``size`` bytes; ``sizes``: each field's payload)."""
        self.keys.add(key)
        self.offsets.append(self.offset)
        self.sigs.append(sample_signature(key, sizes))
        self.digests.append(_digest(pieces))
        self.offset += size
        self.pending.extend(pieces)
        self.pending_size += size
        stats = self.fields
        for field, nbytes in sizes.items():
            st = stats.setdefault(field, {"count": 0, "bytes": 0})
            st["count"] += 1
            st["bytes"] += nbytes

    @property
    def due(self) -> bool:
        """Whether enough bytes are pending to write them out (:meth:`flush`)."""
        return self.pending_size >= _FLUSH

    def flush(self) -> None:
        """Write the pending pieces out."""
        if self.pending:
            parts = _coalesced(self.pending)
            if self._sink is self.hashing:  # a plain tar: hashed and written, never joined
                self.hashing.write_parts(parts)
            else:
                for part in parts:
                    self._sink.write(part)
            self.pending = []
            self.pending_size = 0

    def finish(self) -> tuple[str, bytes]:
        """End the tar (its end-of-archive marker), write it all out and close the
        compression: the shard's checksum and its sample index's bytes."""
        self.pending.append(END_OF_ARCHIVE)
        self.flush()
        if self._compressed:
            self._sink.close()
        checksum = self.hashing.digest.checksum()
        index_bytes = write_index(
            self.offsets,
            self.offset,
            signatures=self.sigs,
            shard_checksum=checksum,
            digests=self.digests,
        )
        return checksum, index_bytes


def _digest(pieces: list[bytes | bytearray | memoryview]) -> int:
    """A sample's digest for the index: of its tar bytes (headers, data, padding)."""
    h = SampleDigester()
    for piece in pieces:
        h.update(piece)
    return h.digest()


def _coalesced(pieces: list[bytes | bytearray | memoryview]) -> list[bytes | memoryview]:
    """``pieces`` with each run of small ones joined; large ones as they are (no copy)."""
    out: list[bytes | memoryview] = []
    run: list[bytes | bytearray | memoryview] = []
    for piece in pieces:
        view = memoryview(piece).cast("B") if not isinstance(piece, bytes) else piece
        if len(view) < _JOIN_BELOW:
            run.append(view)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(view)
    if run:
        out.append(b"".join(run))
    return out
