"""The per-shard sample index: where each sample starts, as a flat binary sidecar file.

Layout (little-endian): the 8-byte magic ``SKIDX001``, a ``uint64`` sample count ``n``,
then ``n + 1`` ``uint64`` offsets: the start of each sample and, last, the offset of the
end-of-archive marker. Sample ``i`` spans ``[off[i], off[i+1])``; the two offsets live at
byte ``16 + 8 * i``, so a reader can fetch them with one 16-byte ranged read.
For a ``.tar.zst`` shard the offsets are positions in the decompressed tar.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from shardkit.errors import ShardFormatError

__all__ = ["INDEX_MAGIC", "index_entry_range", "read_index", "write_index"]

INDEX_MAGIC = b"SKIDX001"
_HEAD = struct.Struct("<8sQ")


def write_index(offsets: Sequence[int], end: int) -> bytes:
    """Encode sample start ``offsets`` and the ``end`` of the last sample."""
    arr = np.empty(len(offsets) + 1, dtype="<u8")
    arr[: len(offsets)] = offsets
    arr[len(offsets)] = end
    return _HEAD.pack(INDEX_MAGIC, len(offsets)) + arr.tobytes()


def read_index(data: bytes, *, url: str = "<index>") -> np.ndarray:
    """Decode an index into an array of ``n + 1`` offsets, checking it is well formed."""
    if len(data) < _HEAD.size:
        raise ShardFormatError("sample index is truncated", url=url, offset=len(data))
    magic, n = _HEAD.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise ShardFormatError("not a shardkit sample index (bad magic)", url=url, offset=0)
    want = _HEAD.size + 8 * (n + 1)
    if len(data) != want:
        raise ShardFormatError(
            f"sample index for {n} samples should be {want} bytes, found {len(data)}",
            url=url,
            offset=min(len(data), want),
        )
    arr = np.frombuffer(data, dtype="<u8", offset=_HEAD.size).astype(np.int64)
    if n and bool(np.any(np.diff(arr) <= 0)):
        raise ShardFormatError("sample index offsets are not increasing", url=url, offset=16)
    return arr


def index_entry_range(i: int) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` in the index file holding offsets ``i`` and ``i + 1``."""
    lo = _HEAD.size + 8 * i
    return lo, lo + 16


def parse_index_pair(data: bytes) -> tuple[int, int]:
    """Decode the 16 bytes :func:`index_entry_range` points at."""
    a, b = struct.unpack("<QQ", data)
    return int(a), int(b)
