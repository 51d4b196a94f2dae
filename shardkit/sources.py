"""Input readers for ``shardkit build``: file trees, JSONL files and existing tar shards.

A build's input is a list of :class:`Unit` s, the pieces of work that parallel workers
and ``--part`` split between them: one JSONL file, one tar shard, or one sample of a file
tree. :func:`discover` turns the user's source arguments into units in a fixed order;
:func:`read_units` turns units into samples (``{"__key__": key, field: bytes}``), each with
the number of input bytes it consumed, so a progress bar can show where the build is.

File trees follow the WebDataset convention: ``dir/abc.jpg`` and ``dir/abc.json`` are the
fields ``jpg`` and ``json`` of the sample ``dir/abc`` (the key is split at the first dot of
the basename). Files are sorted by key, then field, so a sample's files are consecutive
and the order is the same on every run and every machine.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from shardkit.codecs import encode_field, zstd_reader
from shardkit.errors import ConfigError, WriterError
from shardkit.manifest import expand_braces
from shardkit.tario.reader import read_shard, split_key
from shardkit.tario.writer import check_field, check_key

__all__ = [
    "SOURCE_TYPES",
    "FieldMap",
    "SourceError",
    "SourceOptions",
    "Unit",
    "discover",
    "parse_field_spec",
    "read_units",
]

log = logging.getLogger(__name__)

Kind = Literal["files", "jsonl", "tar"]
SOURCE_TYPES = ("auto", "files", "jsonl", "tar")
_JSONL_EXTS = (".jsonl", ".jsonl.zst", ".ndjson", ".ndjson.zst")
_TAR_EXTS = (".tar", ".tar.zst")
Sample = dict[str, Any]


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
    """How JSONL records become samples: ``fields`` mapped to members, ``key_field``."""

    fields: tuple[FieldMap, ...] = ()
    key_field: str | None = None


@dataclass(frozen=True)
class Unit:
    """One piece of input work.

    ``kind`` is ``files`` (one sample of a tree: ``name`` is its key, ``members`` its
    ``(field, path)`` pairs), ``jsonl`` (``name`` is the key prefix of its lines) or ``tar``
    (an existing shard). ``size`` is the bytes it occupies on disk.
    """

    kind: Kind
    path: str
    size: int
    name: str
    members: tuple[tuple[str, str], ...] = ()


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
    return base.endswith(".idx") or (
        base.startswith("manifest") and base.endswith((".json", ".csv"))
    )


def _detect(files: list[str]) -> Kind:
    if files and all(_has_ext(f, _JSONL_EXTS) for f in files):
        return "jsonl"
    tars = [f for f in files if _has_ext(f, _TAR_EXTS)]
    if tars and all(_has_ext(f, _TAR_EXTS) or _is_tar_companion(f) for f in files):
        return "tar"
    return "files"


def _tree_units(root: str, files: list[str]) -> list[Unit]:
    groups: dict[str, list[tuple[str, str]]] = {}
    skipped = 0
    for rel in files:
        kf = split_key(rel)
        if kf is None:
            skipped += 1
            continue
        groups.setdefault(kf[0], []).append((kf[1], rel))
    if skipped:
        log.warning("%s: skipped %d files without an extension (no field name)", root, skipped)
    units = []
    for key in sorted(groups):
        members = sorted(groups[key])
        size = sum(os.path.getsize(os.path.join(root, rel)) for _, rel in members)
        units.append(Unit("files", root, size, key, tuple(members)))
    return units


def _dir_units(root: str, source_type: str, exclude: Sequence[str]) -> list[Unit]:
    files = _walk(root, exclude)
    if source_type == "auto":
        kind: str = _detect(files)
    else:
        kind = source_type
    if kind == "files":
        return _tree_units(root, files)
    exts = _JSONL_EXTS if kind == "jsonl" else _TAR_EXTS
    units = []
    for rel in files:
        if not _has_ext(rel, exts):
            continue
        path = os.path.join(root, rel)
        units.append(Unit(kind, path, os.path.getsize(path), _strip_ext(rel, exts)))  # type: ignore[arg-type]
    return units


def _file_unit(path: str, source_type: str) -> Unit:
    base = os.path.basename(path)
    size = os.path.getsize(path)
    if source_type in ("auto", "jsonl") and _has_ext(base, _JSONL_EXTS):
        return Unit("jsonl", path, size, _strip_ext(base, _JSONL_EXTS))
    if source_type in ("auto", "tar") and _has_ext(base, _TAR_EXTS):
        return Unit("tar", path, size, _strip_ext(base, _TAR_EXTS))
    if source_type == "jsonl":
        return Unit("jsonl", path, size, base.split(".", 1)[0] or base)
    raise ConfigError(
        f"cannot tell what {path!r} is: give a directory, a .jsonl/.jsonl.zst file or a "
        ".tar/.tar.zst shard (or --source-type)"
    )


def discover(
    sources: Iterable[str], *, source_type: str = "auto", exclude: Sequence[str] = ()
) -> list[Unit]:
    """Turn source arguments (paths, directories, brace or glob patterns) into units.

    ``source_type`` forces how directories are read (``files``, ``jsonl``, ``tar``);
    ``auto`` reads a directory holding only JSONL files as JSONL, one holding only tar
    shards (and their manifests and indexes) as shards, anything else as a file tree.
    Directories in ``exclude`` (absolute paths, e.g. the output) are not read.
    """
    if source_type not in SOURCE_TYPES:
        raise ConfigError(f"source type must be one of {', '.join(SOURCE_TYPES)}")
    exclude = [os.path.abspath(e) for e in exclude]
    units: list[Unit] = []
    for src in sources:
        for path in _expand(src):
            if os.path.isdir(path):
                units.extend(_dir_units(path, source_type, exclude))
            elif os.path.isfile(path):
                units.append(_file_unit(path, source_type))
            else:
                raise ConfigError(f"source {path!r} does not exist")
    _check_unique_names(units)
    return units


def _check_unique_names(units: Sequence[Unit]) -> None:
    names: dict[tuple[str, str], str] = {}
    paths: set[str] = set()
    for u in units:
        if u.kind != "files":
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


# -- reading -----------------------------------------------------------------------------
def _jsonl_sample(rec: Any, raw: bytes, key: str, opts: SourceOptions) -> Sample:
    sample: Sample = {"__key__": key}
    if not opts.fields:
        sample["json"] = raw
        return sample
    rest = dict(rec)
    for fm in opts.fields:
        if fm.name not in rec:
            raise ValueError(f"record has no field {fm.name!r} (mapped by --field)")
        value = rest.pop(fm.name)
        if fm.dtype is not None:
            value = np.asarray(value, dtype=fm.dtype)
        sample[fm.field] = encode_field(key, fm.field, value)
    if rest:
        sample["json"] = encode_field(key, "json", rest)
    return sample


def _jsonl_key(rec: Any, unit: Unit, lineno: int, opts: SourceOptions) -> str:
    if opts.key_field is None:
        return f"{unit.name}/{lineno:09d}"
    value = rec.get(opts.key_field)
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"key field {opts.key_field!r} is missing or not a string: {value!r}")
    key = str(value)
    check_key(key)
    return key


def _open_text(unit: Unit) -> io.BufferedIOBase:
    f = open(unit.path, "rb")  # noqa: SIM115 - closed by the caller
    if unit.path.lower().endswith(".zst"):
        raw: Any = zstd_reader(f)
        return io.BufferedReader(raw, buffer_size=1 << 20)
    return f


class _Skip:
    """How many samples are still to be skipped (shared by the unit readers of one run)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def take(self) -> bool:
        """Consume one skip; True when this sample is to be skipped."""
        if self.n:
            self.n -= 1
            return True
        return False


def _read_jsonl(
    unit: Unit, opts: SourceOptions, skip: _Skip
) -> Iterator[tuple[Sample | None, int]]:
    needs_record = bool(opts.fields) or opts.key_field is not None
    try:
        f = _open_text(unit)
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror}", path=unit.path) from exc
    with f:
        for lineno, line in enumerate(f, start=1):
            raw = line.strip()
            if not raw or skip.take():
                yield None, len(line)
                continue
            try:
                rec = json.loads(raw)
                if needs_record and not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
                key = _jsonl_key(rec, unit, lineno, opts)
                sample = _jsonl_sample(rec, raw, key, opts)
            except (ValueError, WriterError) as exc:
                raise SourceError(_describe(exc), path=unit.path, line=lineno) from exc
            yield sample, len(line)


def _describe(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start} of the line"
    return str(exc)


def _read_tree(unit: Unit) -> Sample:
    sample: Sample = {"__key__": unit.name}
    for field, rel in unit.members:
        path = os.path.join(unit.path, rel)
        try:
            with open(path, "rb") as f:
                sample[field] = f.read()
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", path=path) from exc
    return sample


def _read_tar(unit: Unit, skip: _Skip) -> Iterator[tuple[Sample | None, int]]:
    for sample in read_shard(unit.path):
        nbytes = sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
        yield (None if skip.take() else sample), nbytes


def _read_unit(unit: Unit, opts: SourceOptions, skip: _Skip) -> Iterator[tuple[Sample | None, int]]:
    if unit.kind == "files":
        yield (None if skip.take() else _read_tree(unit)), unit.size
    elif unit.kind == "jsonl":
        yield from _read_jsonl(unit, opts, skip)
    else:
        yield from _read_tar(unit, skip)


def read_units(
    units: Iterable[Unit], opts: SourceOptions | None = None, *, skip: int = 0
) -> Iterator[tuple[Sample | None, int]]:
    """Yield ``(sample, input_bytes)`` for every sample of ``units``, in order.

    The first ``skip`` samples (those a resumed build already holds) are yielded as
    ``None`` without being decoded; ``None`` also carries bytes that hold no sample (blank
    lines). The input bytes of a unit add up to its size on disk.
    """
    opts = opts or SourceOptions()
    skipper = _Skip(skip)
    for unit in units:
        budget = unit.size
        for sample, nbytes in _read_unit(unit, opts, skipper):
            step = min(nbytes, budget)
            budget -= step
            yield sample, step
        if budget:
            yield None, budget
