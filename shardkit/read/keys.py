"""The key index of a data set: ``__key__`` to global sample number, built once, then O(1).

Built by reading every sample's key once (a verified sequential read of every shard), it
is kept as one flat file that every process looks keys up in with ``pread`` (a few entries
a lookup; never mapped, see :class:`KeyTable`). Little-endian::

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
import os
import struct
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from xxhash import xxh3_64_intdigest, xxh3_128, xxh3_128_digest

from shardkit.cache.locks import locked
from shardkit.durable import atomic_write
from shardkit.errors import ManifestError
from shardkit.read.remote_compact import form_dir
from shardkit.urls import local_path, url_scheme

__all__ = ["KeyTable", "build_key_table", "key_hash", "key_table_path", "open_key_table"]

log = logging.getLogger(__name__)
MAGIC = b"SKKEYS01"
_HEAD = struct.Struct("<8sQQ16s32s")
_READ = 8 << 20  # bytes per read of the open's whole-file check


def key_hash(key: str) -> int:
    """The 64-bit hash a key is filed under."""
    return int(xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")))


class _Changed(Exception):
    """The file changed after it was checked (rewritten or cut in place)."""


def _identity(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeyTable:
    """An opened key index (see the module docstring), read with ``pread``, never mapped.

    The file is checked whole when opened; a lookup then reads its bucket's few entries and
    confirms, with one ``fstat``, that the file is still the one checked. A file rewritten
    or cut in place under a running job (``cp`` over it, a truncation) can therefore neither
    kill the reader with SIGBUS (as a mapping did) nor hand it another table's numbers: the
    table is opened again, or built again by ``rebuild`` when it no longer fits.

    Args:
        path: the file.
        digest: the content digest of the catalog it must index.
        rebuild: makes the table again (written to ``path``) when the file stops fitting;
            None: a file that stops fitting is a :class:`ManifestError`.
    """

    def __init__(
        self, path: str, digest: str, *, rebuild: Callable[[], KeyTable] | None = None
    ) -> None:
        self.path = path
        self.digest = digest
        self._rebuild = rebuild
        self._fd = -1
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            n, bits, ident = self._check(fd)
        except BaseException:
            os.close(fd)
            raise
        self._adopt(fd, ident, n, bits)

    def _adopt(self, fd: int, ident: tuple[int, ...], n: int, bits: int) -> None:
        """Use the checked file ``fd`` from now on (the one before is closed)."""
        self.close()
        self._fd, self._ident, self.n, self.bits = fd, ident, n, bits
        self._finalizer = weakref.finalize(self, os.close, fd)

    def _check(self, fd: int) -> tuple[int, int, tuple[int, ...]]:
        """The file's count and bucket bits once its header, size, checksum and content
        digest are checked; and its identity then."""
        ident = _identity(fd)
        head = os.pread(fd, _HEAD.size, 0)
        if len(head) < _HEAD.size:
            raise ManifestError("key index is truncated", path=self.path)
        magic, n, bits, check, found = _HEAD.unpack(head)
        if magic != MAGIC or bits > 40:
            raise ManifestError("not a shardkit key index", path=self.path)
        if ident[2] != _HEAD.size + 8 * ((1 << bits) + 1 + 2 * n):
            raise ManifestError("key index has the wrong size", path=self.path)
        h = xxh3_128()
        pos = _HEAD.size
        while pos < ident[2]:
            data = os.pread(fd, min(_READ, ident[2] - pos), pos)
            if not data:
                break
            h.update(data)
            pos += len(data)
        if h.digest() != check or _identity(fd) != ident:
            raise ManifestError("key index is damaged (checksum)", path=self.path)
        if found.decode("ascii", "replace") != self.digest:
            raise ManifestError("key index of another data set content", path=self.path)
        return int(n), int(bits), ident

    def close(self) -> None:
        """Close the file (the table cannot be used after)."""
        if self._fd >= 0:
            self._finalizer()
            self._fd = -1

    def find(self, key: str) -> list[int]:
        """The global sample numbers whose key hash is ``key``'s (the caller checks keys)."""
        h = key_hash(key)
        for _ in range(3):
            try:
                return self._lookup(h)
            except _Changed:
                self._reopen()
        raise ManifestError("key index keeps changing under this reader", path=self.path)

    def _lookup(self, h: int) -> list[int]:
        b = h >> (64 - self.bits)
        nb = (1 << self.bits) + 1
        bounds = self._read(_HEAD.size + 8 * b, 2)
        lo, hi = int(bounds[0]), int(bounds[1])
        if not 0 <= lo <= hi <= self.n:
            raise _Changed
        hashes = self._read(_HEAD.size + 8 * (nb + lo), hi - lo)
        positions = self._read(_HEAD.size + 8 * (nb + self.n + lo), hi - lo)
        if _identity(self._fd) != self._ident:  # what was read may be another table's
            raise _Changed
        return [int(p) for p, x in zip(positions, hashes, strict=True) if int(x) == h]

    def _read(self, offset: int, count: int) -> np.ndarray[Any, Any]:
        data = os.pread(self._fd, 8 * count, offset)
        if len(data) != 8 * count:
            raise _Changed
        return np.frombuffer(data, dtype="<u8")

    def _reopen(self) -> None:
        """Open the file again; build it again where it no longer fits."""
        log.warning("%s: the key index changed under this reader; opening it again", self.path)
        try:
            self._open()
            return
        except FileNotFoundError:
            pass
        except (ManifestError, OSError, ValueError) as exc:
            log.warning("%s: building it again", exc)
        if self._rebuild is None:
            raise ManifestError(
                "key index changed under this reader and no longer fits; remove it and "
                "open the data set again to build it",
                path=self.path,
            )
        fresh = self._rebuild()
        fresh._finalizer.detach()  # its file is this table's from now on
        self._adopt(fresh._fd, fresh._ident, fresh.n, fresh.bits)
        fresh._fd = -1


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


def open_key_table(
    path: str, digest: str, *, rebuild: Callable[[], KeyTable] | None = None
) -> KeyTable | None:
    """The key index at ``path`` if it is whole and for ``digest``; else None."""
    try:
        return KeyTable(path, digest, rebuild=rebuild)
    except FileNotFoundError:
        return None
    except (ManifestError, OSError, ValueError) as exc:
        log.warning("%s: building it again", exc)
        return None


def build_key_table(path: str, digest: str, keys: Callable[[], Iterable[str]]) -> KeyTable:
    """The key index at ``path``: opened if it fits, else built from ``keys()`` once for
    the node (under a lock: processes starting together build it once) and written
    durably; built again the same way if it stops fitting under a running job."""

    def rebuild() -> KeyTable:
        return build_key_table(path, digest, keys)

    table = open_key_table(path, digest, rebuild=rebuild)
    if table is not None:
        return table
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with locked(path + ".lock"):
        table = open_key_table(path, digest, rebuild=rebuild)
        if table is not None:
            return table
        log.info("building the key index %s (reads every sample's key once)", path)
        atomic_write(path, encode_key_table(keys(), digest))
        return KeyTable(path, digest, rebuild=rebuild)
