"""The manifest's compact columnar form: one file of arrays, built once per node.

``manifest.json`` stays the interchange format. Beside it (``manifest.json.cols``) a node
keeps the same shard list as arrays - sizes, sample counts, checksums as raw digests, urls
as a pattern where they follow one (``data-{000000..}.tar``) - that every process reads
instead of parsing: opening a million-shard manifest reads a few hundred bytes of header
and the arrays, never the piece digests (read by block as shards are opened).

A form is only used when it fits: its header names the SHA-256 of the manifest.json it was
built from, and the file's (device, inode, size, mtime_ns, ctime_ns) when it was hashed; a
manifest whose stat differs in any of them is hashed again (a process remembers the hash
per stat), so a manifest rewritten in place with the same size and mtime is noticed by its
ctime and then by its content, never trusted on its name (a remote manifest's form names
its location, url, size and SHA-256 instead, see :mod:`shardkit.read.remote_compact`). The
whole form is checked on open, header included (:mod:`shardkit.format.manifest.compact_file`:
the layout, and why a form replaced under a job cannot hurt it); a damaged one is rebuilt.
The content fingerprint (:func:`fingerprint`) that resume states carry is in the header.

The build writes the form beside manifest.json as it writes the manifest
(:func:`save_manifest`), so the first reader of a huge data set never parses the JSON. A
form that cannot be written (a full disk, a read-only directory) is kept in memory
(:func:`form_in_memory`): the read goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.durable import atomic_write
from shardkit.errors import ManifestError
from shardkit.format.layout import write_hf_config
from shardkit.format.manifest.compact_file import FormFile, encode_form
from shardkit.format.manifest.compact_pieces import WIDTH, PieceColumn, encode_pieces
from shardkit.format.manifest.compact_source import (
    fits_manifest,
    read_source,
    source_facts,
    stat_key,
)
from shardkit.format.manifest.model import Manifest, incomplete_reason

__all__ = [
    "Column",
    "Compact",
    "build_compact",
    "compact_path",
    "encode_compact",
    "build_or_keep",
    "fingerprint",
    "form_in_memory",
    "load_compact",
    "map_compact",
    "save_manifest",
    "write_compact",
    "write_or_keep",
]

log = logging.getLogger(__name__)
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
    """An opened compact form: the manifest's facts and its shard columns (checked,
    private to this process)."""

    header: dict[str, Any]
    sizes: np.ndarray
    counts: np.ndarray
    urls: Column
    checksums: Column
    index: Column
    index_checksums: Column
    path: str
    pieces: PieceColumn
    data: bytes | None = None  # the form's bytes where it lives in memory (no room on disk)

    def __len__(self) -> int:
        return len(self.counts)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its bytes where it lives in memory, else as its path (opened and
        checked again where it is unpickled)."""
        if self.data is not None:
            return (_from_bytes, (self.data, self.path))
        return (map_compact, (self.path,))

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


def build_compact(manifest_path: str, out: str | None = None) -> str:
    """Write the compact form of the local manifest at ``manifest_path`` (atomically)."""
    out = out or compact_path(manifest_path)
    manifest, source = _parse(manifest_path)
    return write_compact(manifest, out, source)


def _parse(manifest_path: str) -> tuple[Manifest, dict[str, Any]]:
    data, source = read_source(manifest_path)
    return Manifest.loads(data, source=os.path.abspath(manifest_path)), source


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
    write_compact(manifest, compact_path(path), source_facts(data, stat_key(os.stat(path))))
    urls = (e.url for e in manifest.shards)
    write_hf_config(os.path.dirname(os.path.abspath(path)), urls, os.path.basename(path))


def encode_compact(manifest: Manifest, source: dict[str, Any]) -> list[bytes | memoryview]:
    """The bytes of the compact form of ``manifest`` (as parts); ``source`` says what it
    was built from (what a reader checks before it trusts the form)."""
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
        "source": source,
        "nshards": len(manifest),
        "total_samples": int(arrays["counts"].sum()),
        "total_bytes": int(arrays["sizes"].sum()),
        "checksum_algorithm": manifest.checksum_algorithm,
        "fields": manifest.fields,
        "created": manifest.created,
        "part": manifest.part,
        "origins": list(manifest.origins),  # an adopted set's remote prefixes (shardkit.urls)
        "columns": meta,
        "digest": fingerprint(arrays["sizes"], arrays["counts"], cols["checksums"]),
    }
    return encode_form(header, arrays)


def write_compact(manifest: Manifest, out: str, source: dict[str, Any]) -> str:
    """Write the compact form of ``manifest`` at ``out`` (see :func:`encode_compact`)."""
    atomic_write(out, encode_compact(manifest, source))  # type: ignore[arg-type]
    return out


def form_in_memory(manifest: Manifest, source: dict[str, Any], path: str) -> Compact:
    """The compact form of ``manifest`` held in memory, for where ``path`` cannot be
    written: the read goes on (``Compact.data`` is set; a worker gets it pickled)."""
    return _from_bytes(b"".join(encode_compact(manifest, source)), path)


def _from_bytes(data: bytes, path: str) -> Compact:
    return _opened(FormFile(data, path), None, data)


def write_or_keep(
    manifest: Manifest, out: str, source: dict[str, Any], fits: Fits | None = None
) -> Compact:
    """The compact form of ``manifest``, written at ``out`` and opened; where it cannot be
    written (a full disk, a read-only directory: OSError) kept in memory, with a warning."""
    try:
        write_compact(manifest, out, source)
    except OSError as exc:
        log.warning("%s: no room for the compact form (%s): keeping it in memory", out, exc)
        return form_in_memory(manifest, source, out)
    return map_compact(out, fits)


def build_or_keep(manifest_path: str, out: str | None = None) -> Compact:
    """:func:`build_compact` and open it, or keep it in memory (:func:`write_or_keep`)."""
    manifest, source = _parse(manifest_path)
    return write_or_keep(manifest, out or compact_path(manifest_path), source)


Fits = Callable[[dict[str, Any]], None]


def load_compact(path: str, manifest_path: str) -> Compact:
    """Open the form at ``path``; ManifestError when it is foreign, stale or damaged."""

    def fits(header: dict[str, Any]) -> None:
        if not fits_manifest(header, manifest_path):
            raise ManifestError("compact form is stale: built from another manifest", path=path)

    return map_compact(path, fits)


def map_compact(path: str, fits: Fits | None = None) -> Compact:
    """Open the form at ``path`` (read and checked, see
    :mod:`shardkit.format.manifest.compact_file`): ``fits(header)`` raises where the form
    is not the one wanted; ManifestError too where it is damaged."""
    return _opened(FormFile(path, path), fits, None)


def _opened(form: FormFile, fits: Fits | None, data: bytes | None) -> Compact:
    header, path = form.header, form.path
    if fits is not None:
        fits(header)
    arrays = form.arrays()
    try:
        cols = {}
        for name in (*_COLUMNS, "pieces"):
            spec = header["columns"][name]
            own = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(name + ".")}
            cols[name] = (spec, own)
        n = int(header["nshards"])
        sizes, counts = arrays["sizes"], arrays["counts"]
        pmeta, parrays = cols["pieces"]
        pieces = PieceColumn(pmeta["meta"], parrays, path)
        if pmeta["meta"].get("kind") != "none":
            pieces.shape, pieces.rows = form.lazy_rows(WIDTH)
        strs = {
            k: Column(v[0]["kind"], v[0]["meta"], v[1]) for k, v in cols.items() if k in _COLUMNS
        }
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
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
        data,
    )
