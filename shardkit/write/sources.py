"""Input readers for ``shardkit build``: file trees, JSONL files and existing tar shards.

A build's input is a list of :class:`Unit` s, the pieces of work that parallel workers
and ``--part`` split between them: one JSONL file, one tar shard, or one sample of a file
tree. :func:`discover` turns the user's source arguments into units in a fixed order;
:func:`read_units` turns units into samples (``{"__key__": key, field: bytes}``), each with
the number of input bytes it consumed, so a progress bar can show where the build is
(the readers are in :mod:`shardkit.write.records`).

File trees follow the WebDataset convention: ``dir/abc.jpg`` and ``dir/abc.json`` are the
fields ``jpg`` and ``json`` of the sample ``dir/abc`` (the key is split at the first dot of
the basename). Files are sorted by key, then field, so a sample's files are consecutive
and the order is the same on every run and every machine.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from shardkit.errors import ConfigError, WriterError
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.images import ImageOptions
from shardkit.format.layout import is_index_name
from shardkit.format.manifest.model import Manifest, expand_braces, incomplete_reason
from shardkit.format.tario.reader import DEFAULT_MAX_MEMBER, split_key
from shardkit.format.tario.writer import check_field
from shardkit.write.select import TreeOptions, group_samples, select_files
from shardkit.write.table_meta import TABLE_EXTS, table_parts

__all__ = [
    "DEFAULT_MAX_RECORD",
    "ON_ERROR",
    "SOURCE_TYPES",
    "BadRecord",
    "DiscoverOptions",
    "FieldMap",
    "SourceError",
    "SourceOptions",
    "Unit",
    "discover",
    "manifest_units",
    "parse_field_spec",
]

log = logging.getLogger(__name__)

Kind = Literal["files", "jsonl", "tar", "call", "table"]
SOURCE_TYPES = ("auto", "files", "jsonl", "tar", "table")
ON_ERROR = ("raise", "skip")
# .json.gz is how many corpora (C4, The Pile) ship JSON lines
_JSONL_EXTS = (
    ".jsonl",
    ".jsonl.zst",
    ".jsonl.gz",
    ".ndjson",
    ".ndjson.zst",
    ".ndjson.gz",
    ".json.gz",
)
DEFAULT_MAX_RECORD = 256 << 20  # a JSONL line or table row: more is a bad record


class SourceError(WriterError):
    """Bad input data: a malformed JSONL line, a record without a mapped field.

    ``path`` names the input file and ``line`` the line (1-based) when there is one.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = path or ""
        if line is not None:
            where += f" line {line}"
        super().__init__(f"{where.strip()}: {message}" if where else message)
        self.path = path
        self.line = line


@dataclass(frozen=True)
class FieldMap:
    """``--field NAME=EXT[:DTYPE]``: record field ``name`` becomes member field ``field``.

    ``field`` is ``NAME.EXT`` (``tokens=npy`` gives the member ``{key}.tokens.npy``);
    ``dtype`` is the numpy dtype of an ``npy`` field (default: what numpy infers).
    """

    name: str
    field: str
    dtype: str | None = None


@dataclass(frozen=True)
class SourceOptions:
    """How inputs become samples: JSONL ``fields`` mapped to members and ``key_field``;
    ``on_error``: ``raise`` stops at a bad record, ``skip`` yields a :class:`BadRecord`
    in its place and goes on (JSONL lines, unreadable tree samples, failing ``fn``
    inputs); ``image`` re-encodes the image files of trees; ``fn(input)`` yields the
    samples of a ``call`` unit (:func:`shardkit.write.build.build` with a function);
    ``max_member`` is the largest member of a tar input held in memory (bytes);
    ``max_record`` the largest JSONL line or table row (bytes), checked as it is read;
    ``tar_policy`` how tar inputs are read (``"lenient"`` skips links, devices, FIFOs)."""

    fields: tuple[FieldMap, ...] = ()
    key_field: str | None = None
    on_error: str = "raise"
    image: ImageOptions | None = None
    fn: Callable[[Any], Iterable[Mapping[str, Any]]] | None = None
    max_member: int = DEFAULT_MAX_MEMBER
    max_record: int = DEFAULT_MAX_RECORD
    check_images: str = "header"
    tar_policy: str = "strict"


@dataclass(frozen=True)
class BadRecord:
    """A record that was skipped (``on_error="skip"``): where it is and why."""

    source: str
    position: str  # "line" for JSONL, "row" for table sources, "input", "sample"
    number: int | str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, self.position: self.number, "reason": self.reason}


@dataclass(frozen=True)
class Unit:
    """One piece of input work.

    ``kind`` is ``files`` (one sample of a tree: ``name`` is its key, ``members`` its
    ``(field, path)`` pairs), ``jsonl`` (``name`` is the key prefix of its lines), ``tar``
    (an existing shard; ``payload`` the reason when it is left out, named in the build's
    error report), ``call`` (``payload`` is one input of a build function;
    ``path`` its repr) or ``table`` (a Parquet row group ``group``, or an Arrow file; see
    :mod:`shardkit.write.tables`). ``size`` is the bytes it occupies on disk (1 for a
    call).
    """

    kind: Kind
    path: str
    size: int
    name: str
    members: tuple[tuple[str, str], ...] = ()
    payload: Any = None
    group: int = -1


def parse_field_spec(spec: str) -> FieldMap:
    """Parse ``NAME=EXT`` or ``NAME=EXT:DTYPE`` (``tokens=npy:int32``)."""
    name, eq, rest = spec.partition("=")
    ext, _, dtype = rest.partition(":")
    if not eq or not name or not ext or "/" in ext or ext.startswith("."):
        raise ConfigError(f"--field wants NAME=EXT or NAME=EXT:DTYPE, got {spec!r}")
    field = f"{name}.{ext}"
    try:
        check_field("<field>", field)
    except WriterError as exc:
        raise ConfigError(f"--field {spec!r}: {exc}") from None
    if dtype:
        if ext != "npy":
            raise ConfigError(f"--field {spec!r}: a dtype only applies to npy fields")
        try:
            np.dtype(dtype)
        except TypeError:
            raise ConfigError(f"--field {spec!r}: unknown numpy dtype {dtype!r}") from None
    return FieldMap(name, field, dtype or None)


# -- discovery -------------------------------------------------------------------------
def _has_ext(path: str, exts: Sequence[str]) -> bool:
    return path.lower().endswith(tuple(exts))


def _strip_ext(path: str, exts: Sequence[str]) -> str:
    lower = path.lower()
    for ext in sorted(exts, key=len, reverse=True):
        if lower.endswith(ext):
            return path[: -len(ext)]
    return path


def _expand(src: str) -> list[str]:
    names = expand_braces(src)
    out: list[str] = []
    for name in names:
        if glob.has_magic(name) and not os.path.exists(name):
            found = sorted(glob.glob(name))
            if not found:
                raise ConfigError(f"source pattern {name!r} matches nothing")
            out.extend(found)
        else:
            out.append(name)
    return out


def _walk(root: str, exclude: Sequence[str]) -> list[str]:
    """Relative posix paths of the visible files under ``root``, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and os.path.abspath(os.path.join(dirpath, d)) not in exclude
        )
        rel = os.path.relpath(dirpath, root)
        for f in filenames:
            if not f.startswith("."):
                found.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
    return sorted(found)


def _is_tar_companion(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return is_index_name(base) or (
        base.startswith("manifest") and base.endswith((".json", ".csv", ".json.cols"))
    )


def _without_shard_sets(root: str, files: list[str], notes: list[str] | None) -> list[str]:
    """The files of a tree less the shard sets inside it (a folder with a manifest.json:
    its shards, indexes and manifests), which would be packed as samples; a note each."""
    sets = {
        rel.rpartition("/")[0]
        for rel in files
        if rel.rsplit("/", 1)[-1] == "manifest.json"
        and _is_shard_set(os.path.join(root, rel.rpartition("/")[0]))
    }
    if not sets:
        return files
    kept, dropped = [], dict.fromkeys(sorted(sets), 0)
    for rel in files:
        folder = rel.rpartition("/")[0]
        base = rel.rsplit("/", 1)[-1]
        if folder in sets and (_has_ext(base, SHARD_SUFFIXES) or _is_tar_companion(base)):
            dropped[folder] += 1
        else:
            kept.append(rel)
    for folder, n in dropped.items():
        where = os.path.join(root, folder) if folder else root
        msg = (
            f"left out {where}: a shard set ({n} files: manifest.json, its shards and indexes) "
            "inside the input; give it as a source of its own to re-shard it"
        )
        log.warning("%s", msg)
        if notes is not None:
            notes.append(msg)
    return kept


def _is_shard_set(folder: str, *, manifest: str | None = None) -> bool:
    """Whether ``folder``'s manifest.json (or the file ``manifest``) is a shardkit
    manifest (not a user's json file)."""
    try:
        with open(manifest or os.path.join(folder, "manifest.json"), "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"shardkit.manifest"' in head


def _detect(files: list[str]) -> Kind:
    if files and all(_has_ext(f, _JSONL_EXTS) for f in files):
        return "jsonl"
    if files and all(_has_ext(f, TABLE_EXTS) for f in files):
        return "table"
    tars = [f for f in files if _has_ext(f, SHARD_SUFFIXES)]
    if tars and all(_has_ext(f, SHARD_SUFFIXES) or _is_tar_companion(f) for f in files):
        return "tar"
    return "files"


def _tree_units(root: str, files: list[str], d: DiscoverOptions) -> list[Unit]:
    keyed: list[tuple[str, str, str]] = []
    skipped = 0
    for rel in select_files(files, d.tree):
        kf = split_key(rel)
        if kf is None:
            skipped += 1
            continue
        keyed.append((kf[0], kf[1], rel))
    if skipped:
        log.warning("%s: skipped %d files without an extension (no field name)", root, skipped)
    reencode = d.image.reencode if d.image is not None else None
    left_out: list[tuple[str, tuple[tuple[str, str], ...], str]] = []
    samples = group_samples(
        root,
        keyed,
        d.tree,
        reencode=reencode,
        skip_bad=d.on_error == "skip",
        notes=d.notes,
        skipped=left_out,
    )
    # a sample left out stays a unit, in key order, so the build's error report names it
    every = [(k, m, None) for k, m in samples] + left_out
    units = []
    for key, members, reason in sorted(every, key=lambda s: s[0]):
        size = sum(os.path.getsize(os.path.join(root, rel)) for _, rel in members)
        units.append(Unit("files", root, size, key, members, payload=reason))
    return units


def _dir_units(root: str, d: DiscoverOptions) -> list[Unit]:
    files = _walk(root, d.exclude)
    kind: str = _detect(files) if d.source_type == "auto" else d.source_type
    if kind == "files":
        return _tree_units(root, _without_shard_sets(root, files, d.notes), d)
    if kind == "table":
        return [
            u
            for rel in files
            if _has_ext(rel, TABLE_EXTS)
            for u in table_units(os.path.join(root, rel), _strip_ext(rel, TABLE_EXTS))
        ]
    exts = _JSONL_EXTS if kind == "jsonl" else SHARD_SUFFIXES
    units = []
    for rel in files:
        if not _has_ext(rel, exts):
            continue
        path = os.path.join(root, rel)
        units.append(Unit(kind, path, os.path.getsize(path), _strip_ext(rel, exts)))  # type: ignore[arg-type]
    return units


def _is_manifest_file(path: str) -> bool:
    return path.lower().endswith(".json") and _is_shard_set(path, manifest=path)


def manifest_units(path: str) -> list[Unit]:
    """The shards a manifest lists, as tar units: ``build old/manifest.json -o new/``
    re-shards a data set. Refuses an incomplete manifest and shards that are not local."""
    m = Manifest.load(path)
    why = incomplete_reason(m)
    if why is not None:
        raise ConfigError(f"{path}: cannot re-shard it: {why}")
    units = []
    for s in m.shards:
        url = m.resolve(s.url)
        if "://" in url:
            raise ConfigError(
                f"{path}: shard {s.url} is not a local file: re-shard from a local copy "
                "(shardkit cache warm, or a download)"
            )
        base = os.path.basename(url)
        units.append(Unit("tar", url, s.size, _strip_ext(base, SHARD_SUFFIXES)))
    return units


def _file_unit(path: str, source_type: str) -> Unit:
    base = os.path.basename(path)
    size = os.path.getsize(path)
    if source_type in ("auto", "jsonl") and _has_ext(base, _JSONL_EXTS):
        return Unit("jsonl", path, size, _strip_ext(base, _JSONL_EXTS))
    if source_type in ("auto", "tar") and _has_ext(base, SHARD_SUFFIXES):
        return Unit("tar", path, size, _strip_ext(base, SHARD_SUFFIXES))
    if source_type == "jsonl":
        return Unit("jsonl", path, size, base.split(".", 1)[0] or base)
    raise ConfigError(
        f"cannot tell what {path!r} is: give a directory, a .jsonl/.jsonl.zst/.jsonl.gz file, "
        "a .tar/.tar.zst/.tar.gz shard or a .parquet/.arrow table (or --source-type)"
    )


@dataclass
class DiscoverOptions:
    """How :func:`discover` reads folders: ``source_type``, output dirs to ``exclude``,
    file selection ``tree``, image re-encoding ``image`` (renames image fields),
    ``on_error`` (``skip`` leaves out samples missing a required field), and ``notes``,
    where things the user should hear about are appended."""

    source_type: str = "auto"
    exclude: Sequence[str] = ()
    tree: TreeOptions = dataclasses.field(default_factory=TreeOptions)
    image: ImageOptions | None = None
    on_error: str = "raise"
    notes: list[str] | None = None


def discover(
    sources: Iterable[str],
    *,
    source_type: str = "auto",
    exclude: Sequence[str] = (),
    options: DiscoverOptions | None = None,
) -> list[Unit]:
    """Turn source arguments (paths, directories, brace or glob patterns) into units.

    ``source_type`` forces how directories are read (``files``, ``jsonl``, ``tar``);
    ``auto`` reads a directory holding only JSONL files as JSONL, one holding only tar
    shards (and their manifests and indexes) as shards, anything else as a file tree.
    Directories in ``exclude`` (absolute paths, e.g. the output) are not read.
    ``options`` (when given) carries these two and the rest of :class:`DiscoverOptions`.
    """
    d = options or DiscoverOptions(source_type, exclude)
    if d.source_type not in SOURCE_TYPES:
        raise ConfigError(f"source type must be one of {', '.join(SOURCE_TYPES)}")
    d.exclude = [os.path.abspath(e) for e in d.exclude]
    units: list[Unit] = []
    for src in sources:
        for path in _expand(src):
            if os.path.isdir(path):
                units.extend(_dir_units(path, d))
            elif os.path.isfile(path) and _is_table(path, d.source_type):
                base = os.path.basename(path)
                units.extend(table_units(path, _strip_ext(base, TABLE_EXTS)))
            elif os.path.isfile(path) and _is_manifest_file(path):
                units.extend(manifest_units(path))
            elif os.path.isfile(path):
                units.append(_file_unit(path, d.source_type))
            else:
                raise ConfigError(f"source {path!r} does not exist")
    _check_unique_names(units)
    return units


def table_units(path: str, name: str) -> list[Unit]:
    """The units of one Parquet file (one per row group) or Arrow file (one)."""
    return [Unit("table", path, size, name, group=g) for g, size in table_parts(path)]


def _is_table(path: str, source_type: str) -> bool:
    return source_type == "table" or (source_type == "auto" and _has_ext(path, TABLE_EXTS))


def _check_unique_names(units: Sequence[Unit]) -> None:
    names: dict[tuple[str, str], str] = {}
    paths: set[str] = set()
    for u in units:
        if u.kind != "files" and u.group <= 0:
            real = os.path.realpath(u.path)
            if real in paths:
                raise ConfigError(f"source {u.path!r} is given twice")
            paths.add(real)
        if u.kind == "tar":
            continue
        prev = names.setdefault((u.kind, u.name), u.path)
        if prev != u.path:
            what = "sample key" if u.kind == "files" else "key prefix"
            raise ConfigError(
                f"{what} {u.name!r} comes from both {prev!r} and {u.path!r}; "
                "give the sources so that keys differ (e.g. their parent directory)"
            )
