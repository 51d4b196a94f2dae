"""The per-shard sample index: where each sample starts, as a flat binary sidecar file.

Version 2 (``SKIDX002``, what shardkit writes), little-endian::

    [0, 8)       magic b"SKIDX002"
    [8, 16)      uint64 sample count n
    [16, 48)     the shard it belongs to: blake2b-256 of the shard's checksum "algo:hex"
    [48, ...)    n + 1 uint64 offsets: the start of each sample, then the end-of-archive
    then         n uint64 sample signatures: xxh3-64 of the key and field names

Sample ``i`` spans ``[off[i], off[i+1])``. An offset alone proves nothing: a read that
seeks to it checks that the sample found there has the signature the index gives (key
and fields, so a sample cut at a field boundary fails too), and a reader checks the
index belongs to its shard before trusting it (an index of another shard is refused).
Both cost a hash of a few names per ranged read.

Version 1 (``SKIDX001``: magic, n, n + 1 offsets at byte 16) is still read, unbound.
For a ``.tar.zst`` shard the offsets are positions in the decompressed tar.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from xxhash import xxh3_64_intdigest as _xxh64

from shardkit.errors import ShardFormatError

__all__ = [
    "INDEX_MAGIC",
    "INDEX_MAGIC_V1",
    "SampleIndex",
    "index_entry_range",
    "index_header_size",
    "parse_index",
    "read_index",
    "sample_signature",
    "shard_binding",
    "signature_range",
    "write_index",
]

INDEX_MAGIC = b"SKIDX002"
INDEX_MAGIC_V1 = b"SKIDX001"
_HEAD = struct.Struct("<8sQ")
_BIND = 32


@dataclass(frozen=True)
class SampleIndex:
    """A decoded index: ``offsets`` (n + 1), and for version 2 each sample's signature
    and the ``shard`` binding (:func:`shard_binding` of the shard's checksum)."""

    offsets: np.ndarray
    signatures: np.ndarray | None = None
    shard: bytes | None = None

    @property
    def version(self) -> int:
        return 1 if self.signatures is None else 2


def sample_signature(key: str, fields: Iterable[str]) -> int:
    """The 64-bit signature of a sample: its key and field names, in tar order."""
    return int(_xxh64("\0".join([key, *fields]).encode("utf-8", "surrogateescape")))


def shard_binding(checksum: str) -> bytes:
    """The 32 bytes that tie an index to the shard whose checksum is ``checksum``."""
    return hashlib.blake2b(checksum.lower().encode(), digest_size=_BIND).digest()


def index_header_size(version: int) -> int:
    """Bytes before the first offset."""
    return _HEAD.size + (_BIND if version == 2 else 0)


def write_index(
    offsets: Sequence[int],
    end: int,
    *,
    signatures: Sequence[int] | None = None,
    shard_checksum: str | None = None,
) -> bytes:
    """Encode sample start ``offsets`` and the ``end`` of the last sample.

    With ``signatures`` (one per sample, :func:`sample_signature`) and the shard's
    checksum this writes version 2, the bound form; without, version 1.
    """
    arr = np.empty(len(offsets) + 1, dtype="<u8")
    arr[: len(offsets)] = offsets
    arr[len(offsets)] = end
    if signatures is None:
        return _HEAD.pack(INDEX_MAGIC_V1, len(offsets)) + arr.tobytes()
    if len(signatures) != len(offsets) or shard_checksum is None:
        raise ValueError("a version 2 index needs one signature per sample and the checksum")
    sig = np.asarray(signatures, dtype="<u8")
    return (
        _HEAD.pack(INDEX_MAGIC, len(offsets))
        + shard_binding(shard_checksum)
        + arr.tobytes()
        + sig.tobytes()
    )


def parse_index(data: bytes, *, url: str = "<index>") -> SampleIndex:
    """Decode an index, checking it is well formed (:class:`ShardFormatError`)."""
    if len(data) < _HEAD.size:
        raise ShardFormatError("sample index is truncated", url=url, offset=len(data))
    magic, n = _HEAD.unpack_from(data)
    if magic not in (INDEX_MAGIC, INDEX_MAGIC_V1):
        raise ShardFormatError("not a shardkit sample index (bad magic)", url=url, offset=0)
    v2 = magic == INDEX_MAGIC
    head = index_header_size(2 if v2 else 1)
    want = head + 8 * (n + 1) + (8 * n if v2 else 0)
    if len(data) != want:
        raise ShardFormatError(
            f"sample index for {n} samples should be {want} bytes, found {len(data)}",
            url=url,
            offset=min(len(data), want),
        )
    arr = np.frombuffer(data, dtype="<u8", count=n + 1, offset=head).astype(np.int64)
    if n and bool(np.any(np.diff(arr) <= 0)):
        raise ShardFormatError("sample index offsets are not increasing", url=url, offset=head)
    if not v2:
        return SampleIndex(arr)
    sigs = np.frombuffer(data, dtype="<u8", count=n, offset=head + 8 * (n + 1))
    return SampleIndex(arr, sigs, bytes(data[_HEAD.size : head]))


def read_index(data: bytes, *, url: str = "<index>") -> np.ndarray:
    """Decode an index into its array of ``n + 1`` offsets (see :func:`parse_index`)."""
    return parse_index(data, url=url).offsets


def index_entry_range(i: int, version: int = 1) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` in the index file holding offsets ``i`` and ``i + 1``."""
    lo = index_header_size(version) + 8 * i
    return lo, lo + 16


def signature_range(i: int, n: int) -> tuple[int, int]:
    """Byte range of sample ``i``'s signature in a version 2 index of ``n`` samples."""
    lo = index_header_size(2) + 8 * (n + 1) + 8 * i
    return lo, lo + 8


def parse_index_pair(data: bytes) -> tuple[int, int]:
    """Decode the 16 bytes :func:`index_entry_range` points at."""
    a, b = struct.unpack("<QQ", data)
    return int(a), int(b)
