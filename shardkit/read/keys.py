"""The key index of a data set: ``__key__`` to global sample number, built once, then O(1).

Built by reading every sample's key once (a verified sequential read of every shard), it
is kept as one flat file, mapped by every process that looks keys up. Little-endian::

    [0, 8)      magic b"SKKEYS01"
    [8, 16)     uint64 sample count n
    [16, 24)    uint64 bucket bits b
    [24, 40)    xxh3-128 of everything after the header
    [40, 72)    the content digest of the catalog it indexes (32 ascii hex digits)
    [72, ...)   2**b + 1 uint64 bucket starts
    then        n uint64 key hashes (xxh3-64 of the utf-8 key), sorted
    then        n uint64 global sample numbers, in the hashes' order

A key's bucket is the top ``b`` bits of its hash (``2**b >= n``: about one entry each),
so a lookup reads one bucket's few entries: no search grows with the data set. A hash
only names candidates: the caller reads the sample and compares its key. A key held by
several samples gives them in manifest order (:meth:`KeyTable.find` lists all).

The file is checked whole (its checksum) and against the catalog's content digest when it
is opened; one that does not fit is built again. A local manifest keeps it beside itself
(``manifest.json.keys``) where the directory is writable; otherwise it lives in the node
cache (``cache_dir/keys/``) or the user's cache dir, named by the content digest.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterable

import numpy as np
from xxhash import xxh3_64_intdigest, xxh3_128_digest

from shardkit.cache.locks import locked
from shardkit.durable import atomic_write
from shardkit.errors import ManifestError
from shardkit.read.remote_compact import form_dir
from shardkit.urls import local_path, url_scheme

__all__ = ["KeyTable", "build_key_table", "key_hash", "key_table_path", "open_key_table"]

log = logging.getLogger(__name__)
MAGIC = b"SKKEYS01"
_HEAD = struct.Struct("<8sQQ16s32s")


def key_hash(key: str) -> int:
    """The 64-bit hash a key is filed under."""
    return int(xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")))


class KeyTable:
    """An opened key index (see the module docstring)."""

    def __init__(self, data: bytes | mmap.mmap, *, path: str, digest: str) -> None:
        if len(data) < _HEAD.size:
            raise ManifestError("key index is truncated", path=path)
        magic, n, bits, check, found = _HEAD.unpack_from(data)
        if magic != MAGIC or bits > 40:
            raise ManifestError("not a shardkit key index", path=path)
        nb = (1 << bits) + 1
        if len(data) != _HEAD.size + 8 * (nb + 2 * n):
            raise ManifestError("key index has the wrong size", path=path)
        if xxh3_128_digest(memoryview(data)[_HEAD.size :]) != check:
            raise ManifestError("key index is damaged (checksum)", path=path)
        if found.decode("ascii", "replace") != digest:
            raise ManifestError("key index of another data set content", path=path)
        self.n = int(n)
        self.bits = int(bits)
        self.buckets = np.frombuffer(data, dtype="<u8", count=nb, offset=_HEAD.size)
        self.hashes = np.frombuffer(data, dtype="<u8", count=n, offset=_HEAD.size + 8 * nb)
        at = _HEAD.size + 8 * (nb + n)
        self.positions = np.frombuffer(data, dtype="<u8", count=n, offset=at)
        self.path = path

    def find(self, key: str) -> list[int]:
        """The global sample numbers whose key hash is ``key``'s (the caller checks keys)."""
        h = key_hash(key)
        b = h >> (64 - self.bits)
        lo, hi = int(self.buckets[b]), int(self.buckets[b + 1])
        return [int(self.positions[k]) for k in range(lo, hi) if int(self.hashes[k]) == h]


def encode_key_table(keys: Iterable[str], digest: str) -> bytes:
    """The key index file of ``keys`` (in global sample order) for content ``digest``."""
    hashes = np.fromiter((key_hash(k) for k in keys), dtype=np.uint64)
    n = len(hashes)
    bits = max(1, int(n - 1).bit_length()) if n > 1 else 1
    order = np.lexsort((np.arange(n, dtype=np.uint64), hashes))
    hashes = hashes[order]
    top = (hashes >> np.uint64(64 - bits)).astype(np.int64)
    buckets = np.searchsorted(top, np.arange((1 << bits) + 1), side="left").astype("<u8")
    body = buckets.tobytes() + hashes.astype("<u8").tobytes() + order.astype("<u8").tobytes()
    head = _HEAD.pack(MAGIC, n, bits, xxh3_128_digest(body), digest.encode("ascii"))
    return head + body


def key_table_path(source: str | None, digest: str, cache_dir: str | None) -> str:
    """Where the key index of a data set lives (see the module docstring)."""
    if source is not None and url_scheme(source) == "file":
        path = local_path(source)
        if os.path.isfile(path) and os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            return path + ".keys"
    return os.path.join(os.path.dirname(form_dir(cache_dir)), "keys", digest + ".keys")


def _load(path: str, digest: str) -> KeyTable:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    return KeyTable(data, path=path, digest=digest)


def open_key_table(path: str, digest: str) -> KeyTable | None:
    """The key index at ``path`` if it is whole and for ``digest``; else None."""
    try:
        return _load(path, digest)
    except FileNotFoundError:
        return None
    except (ManifestError, OSError, ValueError) as exc:
        log.warning("%s: building it again", exc)
        return None


def build_key_table(path: str, digest: str, keys: Iterable[str]) -> KeyTable:
    """The key index at ``path``: opened if it fits, else built from ``keys`` once for the
    node (under a lock: processes starting together build it once) and written durably."""
    table = open_key_table(path, digest)
    if table is not None:
        return table
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with locked(path + ".lock"):
        table = open_key_table(path, digest)
        if table is not None:
            return table
        log.info("building the key index %s (reads every sample's key once)", path)
        atomic_write(path, encode_key_table(keys, digest))
        return _load(path, digest)
