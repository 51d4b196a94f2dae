"""The per-shard sample index: where each sample starts, as a flat binary sidecar file.

Version 3 (``SKIDX003``, what shardkit writes), little-endian::

    [0, 8)       magic b"SKIDX003"
    [8, 16)      uint64 sample count n
    [16, 48)     the shard it belongs to: blake2b-256 of the shard's checksum "algo:hex"
    [48, ...)    n + 1 uint64 offsets: the start of each sample, then the end-of-archive
    then         n uint64 sample signatures: xxh3-64 of the key and field names
    then         n uint64 sample digests: xxh3-64 of the sample's bytes [off[i], off[i+1])

Version 2 (``SKIDX002``) is version 3 without the digests; version 1 (``SKIDX001``:
magic, n, n + 1 offsets at byte 16) has neither binding nor signatures. All three are read.

Sample ``i`` spans ``[off[i], off[i+1])``. An offset alone proves nothing: a read that
seeks to it checks that the sample found there has the signature the index gives (key
and fields, so a sample cut at a field boundary fails too), and a reader checks the
index belongs to its shard before trusting it (an index of another shard is refused).
Both cost a hash of a few names per ranged read.

A sample's digest covers exactly the bytes a lookup of it reads and parses: every tar
header (pax headers included), member data and padding from its first header up to the
next sample's (for the last one, up to the end-of-archive marker), so one changed byte
anywhere in them is found by hashing that sample alone, not the piece around it. The
digest is xxh3-64: about 50 GB/s a core here, against sha256's 0.9 GB/s, so a verified
lookup of a 150 KB sample costs ~3 us of hashing where its 1 MiB piece cost ~1.1 ms. It
finds corruption (a flipped bit, a torn write, another file's bytes: 2**-64 to miss one);
it is not a defence against someone who forges shards, which is what the manifest's
sha256 is. A reader trusts the digests only of an index the manifest vouches for (its
``index_checksum``, in the manifest's algorithm): the digests are then as good as the
manifest. Cost: 8 bytes a sample (a version 3 index is 24 bytes a sample; 4 KB samples:
2 GB of digests per TB of shards, 150 KB samples: 53 MB per TB).

For a ``.tar.zst`` / ``.tar.gz`` shard offsets and digests are of the decompressed tar.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from xxhash import xxh3_64
from xxhash import xxh3_64_intdigest as _xxh64

from shardkit.errors import ChecksumError, ShardFormatError

__all__ = [
    "INDEX_MAGIC",
    "INDEX_MAGICS",
    "INDEX_MAGIC_V1",
    "INDEX_MAGIC_V2",
    "SampleDigester",
    "SampleIndex",
    "check_sample",
    "index_entry_range",
    "index_header_size",
    "index_size",
    "index_version",
    "parse_index",
    "read_index",
    "sample_digest",
    "sample_signature",
    "shard_binding",
    "signature_range",
    "write_index",
]

INDEX_MAGIC = b"SKIDX003"  # what shardkit writes
INDEX_MAGIC_V2 = b"SKIDX002"
INDEX_MAGIC_V1 = b"SKIDX001"
INDEX_MAGICS = (INDEX_MAGIC, INDEX_MAGIC_V2, INDEX_MAGIC_V1)
_VERSIONS = {INDEX_MAGIC: 3, INDEX_MAGIC_V2: 2, INDEX_MAGIC_V1: 1}
_HEAD = struct.Struct("<8sQ")
_BIND = 32
Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class SampleIndex:
    """A decoded index: ``offsets`` (n + 1); from version 2 each sample's signature and
    the ``shard`` binding (:func:`shard_binding` of the shard's checksum); from version 3
    each sample's ``digests`` (:func:`sample_digest` of its bytes)."""

    offsets: np.ndarray
    signatures: np.ndarray | None = None
    shard: bytes | None = None
    digests: np.ndarray | None = None

    @property
    def version(self) -> int:
        if self.signatures is None:
            return 1
        return 2 if self.digests is None else 3

    def sample_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Each sample's ``(offsets, sizes, digests)`` (three arrays of n), or None for an
        index without digests (version 1 or 2). Sample ``i`` is the bytes
        ``[offsets[i], offsets[i] + sizes[i])`` of the (decompressed) tar, and
        :func:`sample_digest` of exactly those bytes is ``digests[i]``. Trust them only
        as far as the index is trusted: see :meth:`shardkit.read.indexes.IndexReader.spans`."""
        if self.digests is None:
            return None
        return self.offsets[:-1], np.diff(self.offsets), self.digests


def sample_digest(data: Buffer) -> int:
    """The digest of one sample's bytes, as a version 3 index holds it (xxh3-64)."""
    return int(_xxh64(data))


def check_sample(data: Buffer, digest: int, *, url: str, sample: int, offset: int) -> None:
    """Raise :class:`ChecksumError` (naming the shard ``url``, the ``sample``'s number in
    it and its ``offset``) unless ``data`` (that sample's bytes) has ``digest``."""
    actual = sample_digest(data)
    if actual != digest:
        raise ChecksumError(
            f"sample {sample} (bytes {offset}..{offset + len(data)}) differs from its "
            "digest in the sample index: the shard is damaged; not read",
            url=url,
            offset=offset,
            expected=f"xxh3_64:{digest:016x}",
            actual=f"xxh3_64:{actual:016x}",
        )


class SampleDigester:
    """:func:`sample_digest` of bytes given in parts (``update`` each, then ``digest``)."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = xxh3_64()

    def update(self, data: Buffer) -> None:
        self._h.update(data)

    def digest(self) -> int:
        """The digest of the bytes given so far."""
        return int(self._h.intdigest())


def sample_signature(key: str, fields: Iterable[str]) -> int:
    """The 64-bit signature of a sample: its key and field names, in tar order."""
    return int(_xxh64("\0".join([key, *fields]).encode("utf-8", "surrogateescape")))


def shard_binding(checksum: str) -> bytes:
    """The 32 bytes that tie an index to the shard whose checksum is ``checksum``."""
    return hashlib.blake2b(checksum.lower().encode(), digest_size=_BIND).digest()


def index_header_size(version: int) -> int:
    """Bytes before the first offset."""
    return _HEAD.size + (_BIND if version >= 2 else 0)


def write_index(
    offsets: Sequence[int],
    end: int,
    *,
    signatures: Sequence[int] | None = None,
    shard_checksum: str | None = None,
    digests: Sequence[int] | None = None,
) -> bytes:
    """Encode sample start ``offsets`` and the ``end`` of the last sample.

    With ``signatures`` (one per sample, :func:`sample_signature`), the shard's checksum
    and ``digests`` (one per sample, :func:`sample_digest`) this writes version 3; with
    signatures and checksum alone version 2, the bound form; with neither, version 1.
    """
    arr = np.empty(len(offsets) + 1, dtype="<u8")
    arr[: len(offsets)] = offsets
    arr[len(offsets)] = end
    if signatures is None:
        if digests is not None:
            raise ValueError("an index with sample digests needs their signatures")
        return _HEAD.pack(INDEX_MAGIC_V1, len(offsets)) + arr.tobytes()
    if len(signatures) != len(offsets) or shard_checksum is None:
        raise ValueError("a version 2 index needs one signature per sample and the checksum")
    if digests is not None and len(digests) != len(offsets):
        raise ValueError("a version 3 index needs one digest per sample")
    sig = np.asarray(signatures, dtype="<u8")
    magic = INDEX_MAGIC_V2 if digests is None else INDEX_MAGIC
    tail = b"" if digests is None else np.asarray(digests, dtype="<u8").tobytes()
    return (
        _HEAD.pack(magic, len(offsets))
        + shard_binding(shard_checksum)
        + arr.tobytes()
        + sig.tobytes()
        + tail
    )


def parse_index(data: bytes, *, url: str = "<index>") -> SampleIndex:
    """Decode an index, checking it is well formed (:class:`ShardFormatError`)."""
    if len(data) < _HEAD.size:
        raise ShardFormatError("sample index is truncated", url=url, offset=len(data))
    magic, n = _HEAD.unpack_from(data)
    version = _VERSIONS.get(magic)
    if version is None:
        raise ShardFormatError("not a shardkit sample index (bad magic)", url=url, offset=0)
    head = index_header_size(version)
    want = index_size(version, n)
    if len(data) != want:
        raise ShardFormatError(
            f"sample index for {n} samples should be {want} bytes, found {len(data)}",
            url=url,
            offset=min(len(data), want),
        )
    arr = np.frombuffer(data, dtype="<u8", count=n + 1, offset=head).astype(np.int64)
    if n and bool(np.any(np.diff(arr) <= 0)):
        raise ShardFormatError("sample index offsets are not increasing", url=url, offset=head)
    if version == 1:
        return SampleIndex(arr)
    sigs = np.frombuffer(data, dtype="<u8", count=n, offset=head + 8 * (n + 1))
    digests = None
    if version == 3:
        digests = np.frombuffer(data, dtype="<u8", count=n, offset=head + 16 * n + 8)
    return SampleIndex(arr, sigs, bytes(data[_HEAD.size : head]), digests)


def read_index(data: bytes, *, url: str = "<index>") -> np.ndarray:
    """Decode an index into its array of ``n + 1`` offsets (see :func:`parse_index`)."""
    return parse_index(data, url=url).offsets


def index_size(version: int, n: int) -> int:
    """The size in bytes of a version ``version`` index of ``n`` samples."""
    per_sample = {1: 8, 2: 16, 3: 24}[version]
    return index_header_size(version) + 8 + per_sample * n


def index_version(magic: bytes) -> int | None:
    """The version an index's first 8 bytes name, or None when they are no index magic."""
    return _VERSIONS.get(bytes(magic))


def index_entry_range(i: int, version: int = 1) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` in the index file holding offsets ``i`` and ``i + 1``."""
    lo = index_header_size(version) + 8 * i
    return lo, lo + 16


def signature_range(i: int, n: int) -> tuple[int, int]:
    """Byte range of sample ``i``'s signature in a version 2 or 3 index of ``n`` samples."""
    lo = index_header_size(2) + 8 * (n + 1) + 8 * i
    return lo, lo + 8


def parse_index_pair(data: bytes) -> tuple[int, int]:
    """Decode the 16 bytes :func:`index_entry_range` points at."""
    a, b = struct.unpack("<QQ", data)
    return int(a), int(b)
