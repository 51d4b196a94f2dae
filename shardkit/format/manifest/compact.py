"""The manifest's compact columnar form: one file of arrays, shared through the page cache.

``manifest.json`` stays the interchange format. Beside it (``manifest.json.cols``) a node
keeps the same shard list as arrays - sizes, sample counts, checksums as raw digests, urls
as a pattern where they follow one (``data-{000000..}.tar``) - that every process maps
(``mmap``) instead of parsing: opening a million-shard manifest reads a few hundred bytes
of header, and the arrays' pages are shared by every process on the node.

A form is only used when it fits: its header names the size, inode, mtime and SHA-256 of
the manifest.json it was built from (a changed manifest is hashed again, never trusted on
its name alone; a remote manifest's form names its url, ETag, size and SHA-256 instead,
see :mod:`shardkit.read.remote_compact`), and a SHA-256 over its arrays (checked on open:
a truncated or altered file is rebuilt) - all but the piece digests, which are checked
block by block as they are read (:mod:`shardkit.format.manifest.compact_pieces`). The content
fingerprint (:func:`fingerprint`) that resume states carry is kept in the header.

The build writes the form beside manifest.json as it writes the manifest
(:func:`save_manifest`), so the first reader of a huge data set never parses the JSON.

Layout: ``MAGIC``, header length (u64 LE), header JSON, then the arrays, each at a
64-byte aligned offset the header gives.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.durable import atomic_write
from shardkit.errors import ManifestError
from shardkit.format.manifest.compact_pieces import LAZY, PieceColumn, encode_pieces
from shardkit.format.manifest.model import Manifest, incomplete_reason

__all__ = [
    "Column",
    "Compact",
    "build_compact",
    "compact_path",
    "fingerprint",
    "load_compact",
    "map_compact",
    "save_manifest",
    "write_compact",
]

log = logging.getLogger(__name__)
MAGIC = b"SKCOLS\x00\x01"
FORMAT = "shardkit-columns"
VERSION = 2  # 2: piece checksums
_HEAD = struct.Struct("<8sQ")
_ALIGN = 64
_NUM = re.compile(r"^(.*?)(\d+)([^/\d]*)$")


def compact_path(manifest_path: str) -> str:
    """Where the compact form of a local manifest lives."""
    return manifest_path + ".cols"


@dataclass
class Column:
    """A column of strings (or None): a pattern, raw hex digests, or a blob with offsets.

    ``kind`` is ``"none"`` (all None), ``"pattern"`` (``prefix + str(start + i).zfill(width)
    + suffix``), ``"hex"`` (``prefix + digests[i].hex()``) or ``"blob"``.
    """

    kind: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def __getitem__(self, i: int) -> str | None:
        m, a = self.meta, self.arrays
        if self.kind == "none":
            return None
        if self.kind == "pattern":
            return f"{m['prefix']}{str(m['start'] + i).zfill(m['width'])}{m['suffix']}"
        if self.kind == "hex":
            return str(m["prefix"]) + bytes(a["digests"][i]).hex()
        if a["nulls"][i]:
            return None
        off = a["offsets"]
        return bytes(a["blob"][int(off[i]) : int(off[i + 1])]).decode("utf-8")

    def ident_bytes(self) -> Iterator[bytes]:
        """The column as bytes for a fingerprint, in chunks (never all strings at once)."""
        yield self.kind.encode() + json.dumps(self.meta, sort_keys=True).encode()
        for name in sorted(self.arrays):
            yield np.ascontiguousarray(self.arrays[name]).tobytes()

    @classmethod
    def encode(cls, values: Sequence[str | None]) -> Column:
        """The most compact kind that holds ``values`` exactly."""
        if all(v is None for v in values):
            return cls("none", {}, {})
        if all(v is not None for v in values):
            strs = [v for v in values if v is not None]
            return _as_pattern(strs) or _as_hex(strs) or _as_blob(values)
        return _as_blob(values)


def _as_pattern(values: list[str]) -> Column | None:
    m = _NUM.match(values[0]) if values else None
    if m is None:
        return None
    prefix, digits, suffix = m.groups()
    start, width = int(digits), len(digits)
    for i, v in enumerate(values):
        if v != f"{prefix}{str(start + i).zfill(width)}{suffix}":
            return None
    return Column(
        "pattern", {"prefix": prefix, "start": start, "width": width, "suffix": suffix}, {}
    )


def _as_hex(values: list[str]) -> Column | None:
    prefix = values[0].rsplit(":", 1)[0] + ":" if ":" in values[0] else ""
    width = len(values[0]) - len(prefix)
    if width % 2 or any(len(v) != len(prefix) + width or not v.startswith(prefix) for v in values):
        return None
    try:
        raw = bytes.fromhex("".join(v[len(prefix) :] for v in values))
    except ValueError:
        return None
    if raw.hex() != "".join(v[len(prefix) :] for v in values):  # upper-case hex: keep as is
        return None
    digests = np.frombuffer(raw, dtype=np.uint8).reshape(len(values), width // 2)
    return Column("hex", {"prefix": prefix}, {"digests": digests})


def _as_blob(values: Sequence[str | None]) -> Column:
    parts = [(v or "").encode("utf-8") for v in values]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    blob = np.frombuffer(b"".join(parts), dtype=np.uint8)
    nulls = np.array([v is None for v in values], dtype=np.bool_)
    return Column("blob", {}, {"blob": blob, "offsets": offsets, "nulls": nulls})


def fingerprint(sizes: np.ndarray, counts: np.ndarray, ident: Column) -> str:
    """The content fingerprint of a shard list: sizes, sample counts and each shard's
    checksum (its url's base name where it has none), in order."""
    h = hashlib.sha256(b"shardkit-content-2\n")
    h.update(np.ascontiguousarray(sizes, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(counts, dtype="<i8").tobytes())
    for part in ident.ident_bytes():
        h.update(part)
    return h.hexdigest()[:32]


@dataclass
class Compact:
    """An opened compact form: the manifest's facts and its shard columns (mapped)."""

    header: dict[str, Any]
    sizes: np.ndarray
    counts: np.ndarray
    urls: Column
    checksums: Column
    index: Column
    index_checksums: Column
    path: str
    pieces: PieceColumn

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def digest(self) -> str:
        return str(self.header["digest"])


_COLUMNS = ("urls", "checksums", "index", "index_checksums")


def _columns(manifest: Manifest) -> dict[str, Column]:
    s = manifest.shards
    return {
        "urls": Column.encode([e.url for e in s]),
        "checksums": Column.encode([e.checksum for e in s]),
        "index": Column.encode([e.index for e in s]),
        "index_checksums": Column.encode([e.index_checksum for e in s]),
    }


def _all_safe(manifest: Manifest) -> bool:
    """Whether every url resolves inside the manifest's base (no ``pipe:``, no ``..`` out):
    a reader that does not allow unsafe urls reads a form only where this holds."""
    try:
        for e in manifest.shards:
            manifest.resolve(e.url)
            if e.index is not None:
                manifest.resolve(e.index)
    except ManifestError:
        return False
    return True


def _source_facts(manifest_path: str, data: bytes) -> dict[str, Any]:
    st = os.stat(manifest_path)
    return {
        "size": st.st_size,
        "ino": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def build_compact(manifest_path: str, out: str | None = None) -> str:
    """Write the compact form of the local manifest at ``manifest_path`` (atomically)."""
    out = out or compact_path(manifest_path)
    with open(manifest_path, "rb") as f:
        data = f.read()
    source = _source_facts(manifest_path, data)
    manifest = Manifest.loads(data, source=os.path.abspath(manifest_path))
    del data
    return write_compact(manifest, out, source)


def save_manifest(manifest: Manifest, path: str, *, csv_too: bool = True) -> None:
    """Write ``manifest`` at ``path`` (as :meth:`Manifest.save`) and its compact form
    beside it from the entries in memory: no reader has to parse the JSON to build it.
    A ``.csv`` path gets the CSV alone, as :meth:`Manifest.save` writes it."""
    if path.lower().endswith(".csv"):
        manifest.save(path)
        return
    data = manifest.dumps().encode()
    if csv_too:
        atomic_write(os.path.splitext(path)[0] + ".csv", manifest.to_csv().encode())
    atomic_write(path, data)
    write_compact(manifest, compact_path(path), _source_facts(path, data))


def write_compact(manifest: Manifest, out: str, source: dict[str, Any]) -> str:
    """Write the compact form of ``manifest`` at ``out``; ``source`` says what it was
    built from (what a reader checks before it trusts the form)."""
    cols = _columns(manifest)
    arrays: dict[str, np.ndarray] = {
        "sizes": np.fromiter((e.size for e in manifest.shards), "<i8", len(manifest)),
        "counts": np.fromiter((e.nsamples for e in manifest.shards), "<i8", len(manifest)),
    }
    meta: dict[str, Any] = {}
    for name, col in cols.items():
        meta[name] = {"kind": col.kind, "meta": col.meta}
        for key, arr in col.arrays.items():
            arrays[f"{name}.{key}"] = arr
    pmeta, parrays = encode_pieces([e.pieces for e in manifest.shards])
    meta["pieces"] = {"kind": pmeta["kind"], "meta": pmeta}
    arrays.update({f"pieces.{k}": v for k, v in parrays.items()})
    header: dict[str, Any] = {
        "safe_urls": _all_safe(manifest),
        "incomplete": incomplete_reason(manifest),
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "nshards": len(manifest),
        "total_samples": int(arrays["counts"].sum()),
        "total_bytes": int(arrays["sizes"].sum()),
        "checksum_algorithm": manifest.checksum_algorithm,
        "fields": manifest.fields,
        "created": manifest.created,
        "part": manifest.part,
        "origins": list(manifest.origins),  # an adopted set's remote prefixes (urls.py)
        "columns": meta,
        "digest": fingerprint(arrays["sizes"], arrays["counts"], cols["checksums"]),
    }
    blobs: list[bytes | memoryview] = []
    layout: dict[str, Any] = {}
    offset = 0
    h = hashlib.sha256()
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        layout[name] = [offset, arr.dtype.str, list(arr.shape)]
        pad = b"\0" * (-len(raw) % _ALIGN)
        if name != LAZY:  # checked block by block as it is read (compact_pieces)
            h.update(raw)
            h.update(pad)
        blobs += [raw, pad]
        offset += len(raw) + len(pad)
    header["arrays"] = layout
    header["arrays_sha256"] = h.hexdigest()
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * (-(len(text) + _HEAD.size) % _ALIGN)
    atomic_write(out, [_HEAD.pack(MAGIC, len(text)), text, *blobs])  # type: ignore[list-item]
    return out


def _read_header(mm: mmap.mmap, path: str) -> tuple[dict[str, Any], int]:
    if len(mm) < _HEAD.size:
        raise ManifestError("compact form is truncated", path=path)
    magic, n = _HEAD.unpack(mm[: _HEAD.size])
    if magic != MAGIC or _HEAD.size + n > len(mm):
        raise ManifestError("not a shardkit compact manifest", path=path)
    header = json.loads(bytes(mm[_HEAD.size : _HEAD.size + n]))
    if not isinstance(header, dict) or (header.get("format"), header.get("version")) != (
        FORMAT,
        VERSION,
    ):
        raise ManifestError("compact form of another format or version", path=path)
    return header, _HEAD.size + n


def _fits(header: dict[str, Any], manifest_path: str) -> bool:
    """Whether the form was built from the manifest now at ``manifest_path``."""
    src = header.get("source") or {}
    st = os.stat(manifest_path)
    if (src.get("size"), src.get("ino"), src.get("mtime_ns")) == (
        st.st_size,
        st.st_ino,
        st.st_mtime_ns,
    ):
        return True
    if src.get("size") != st.st_size:
        return False
    h = hashlib.sha256()
    with open(manifest_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return bool(h.hexdigest() == src.get("sha256"))


def load_compact(path: str, manifest_path: str) -> Compact:
    """Map the form at ``path``; ManifestError when it is foreign, stale or damaged."""

    def fits(header: dict[str, Any]) -> None:
        if not _fits(header, manifest_path):
            raise ManifestError("compact form is stale: built from another manifest", path=path)

    return map_compact(path, fits)


def map_compact(path: str, fits: Callable[[dict[str, Any]], None] | None = None) -> Compact:
    """Map the form at ``path``: ``fits(header)`` raises where the form is not the one
    wanted; ManifestError too where it is damaged (its arrays' checksum, their shapes)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    header, start = _read_header(mm, path)
    if fits is not None:
        fits(header)
    body = memoryview(mm)[start:]
    try:
        layout = header["arrays"]
        h = hashlib.sha256()
        for name, (offset, dtype, shape) in sorted(layout.items(), key=lambda kv: kv[1][0]):
            if name != LAZY:
                n = int(np.prod(shape)) * np.dtype(dtype).itemsize if shape else 0
                h.update(body[offset : offset + n + (-n % _ALIGN)])
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ManifestError(f"compact form's header is damaged: {exc!r}", path=path) from None
    if h.hexdigest() != header.get("arrays_sha256"):
        raise ManifestError("compact form's arrays do not match their checksum", path=path)
    arrays: dict[str, np.ndarray] = {}
    try:
        for name, (offset, dtype, shape) in layout.items():
            dt = np.dtype(dtype)
            count = int(np.prod(shape)) if shape else 1
            arrays[name] = np.frombuffer(body, dtype=dt, count=count, offset=offset).reshape(shape)
        cols = {}
        for name in (*_COLUMNS, "pieces"):
            spec = header["columns"][name]
            own = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(name + ".")}
            cols[name] = (spec, own)
        n = int(header["nshards"])
        sizes, counts = arrays["sizes"], arrays["counts"]
        pieces = PieceColumn(cols["pieces"][0]["meta"], cols["pieces"][1], path)
        strs = {
            k: Column(v[0]["kind"], v[0]["meta"], v[1]) for k, v in cols.items() if k in _COLUMNS
        }
    except (KeyError, ValueError, TypeError) as exc:
        raise ManifestError(
            f"compact form's header does not fit its arrays: {exc}", path=path
        ) from None
    if len(sizes) != n or len(counts) != n:
        raise ManifestError("compact form's arrays do not have one row per shard", path=path)
    pieces.check(n)
    return Compact(
        header,
        sizes,
        counts,
        strs["urls"],
        strs["checksums"],
        strs["index"],
        strs["index_checksums"],
        path,
        pieces,
    )
