"""Discovery for ``shardkit build``: the user's source arguments (folders, files, globs,
brace patterns, manifests of existing shards, tables) turned into :class:`Unit` s in a
fixed order, the same on every run and every machine (see :mod:`shardkit.write.inputs.sources`)."""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardkit.errors import ConfigError
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.images import ImageOptions
from shardkit.format.layout import is_index_name
from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.format.tario.names import split_key
from shardkit.urls import expand_braces
from shardkit.write.inputs.select import TreeOptions, group_samples, select_files
from shardkit.write.inputs.sources import JSONL_EXTS, SOURCE_TYPES, Kind, Unit
from shardkit.write.inputs.table_meta import TABLE_EXTS, table_parts

__all__ = ["DiscoverOptions", "discover", "manifest_units", "table_units"]

log = logging.getLogger(__name__)


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
        _say(msg, notes)
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


_DOC_EXTS = (".md", ".rst", ".txt", ".pdf", ".html", ".yaml", ".yml", ".cff")
_DOC_STEMS = ("readme", "license", "licence", "copying", "notice", "citation", "changelog")


def _is_doc(rel: str) -> bool:
    """A document beside data files (a README, a dataset card, a license), not data."""
    base = rel.rsplit("/", 1)[-1].lower()
    return base.endswith(_DOC_EXTS) or base.split(".", 1)[0] in _DOC_STEMS


def _detect_records(root: str, files: list[str], notes: list[str] | None) -> tuple[Kind, list[str]]:
    """How a folder is read, and its files: JSONL, tables or shards when every file but the
    documents beside them (README.md, a dataset card, a license) is one (the documents are
    left out, with a note), else a file tree of every file."""
    kind = _detect(files)
    docs = [f for f in files if _is_doc(f)]
    if kind != "files" or not docs or len(docs) == len(files):
        return kind, files
    data = [f for f in files if not _is_doc(f)]
    kind = _detect(data)
    if kind == "files":
        return kind, files
    shown = ", ".join(docs[:3]) + (", ..." if len(docs) > 3 else "")
    msg = f"{root}: read as {kind} records; left out {len(docs)} document(s) beside them: {shown}"
    _say(msg, notes)
    return kind, data


def _record_kind(rel: str) -> Kind | None:
    if _has_ext(rel, JSONL_EXTS):
        return "jsonl"
    if _has_ext(rel, TABLE_EXTS):
        return "table"
    if _has_ext(rel, SHARD_SUFFIXES):
        return "tar"
    return None


def _refuse_strays(root: str, data: list[str]) -> None:
    """Refuse a folder whose files (documents aside) are at least half records (JSONL,
    tables, shards) and the rest something else: packing each file as one sample (a file
    tree) is then never what was meant, and read as records the others would be lost."""
    kinds = [k for k in map(_record_kind, data) if k is not None]
    if not kinds or 2 * len(kinds) < len(data):
        return
    order: tuple[Kind, ...] = ("jsonl", "table", "tar")
    kind = max(order, key=kinds.count)
    strays = [
        f for f in data if _record_kind(f) != kind and not (kind == "tar" and _is_tar_companion(f))
    ]
    shown = ", ".join(strays[:3]) + (", ..." if len(strays) > 3 else "")
    names = (f.rsplit("/", 1)[-1] for f in strays)
    globs = dict.fromkeys("*." + b.rsplit(".", 1)[1] if "." in b else b for b in names)
    excl = " ".join(f"--exclude '{g}'" for g in list(globs)[:3])
    raise ConfigError(
        f"{root}: {len(data) - len(strays)} {kind} file(s) and {len(strays)} other(s) beside "
        f"them ({shown}): a folder is read as records only when every file is one "
        f"(documents aside); leave the others out ({excl}), give the record files as "
        "sources, or pack every file as one sample with --source-type files"
    )


def _say(msg: str, notes: list[str] | None) -> None:
    """A note for the caller to show (the CLI prints each once), else a logged warning:
    never both (with no logging set up, Python prints the warning too: each line twice)."""
    if notes is not None:
        notes.append(msg)
    else:
        log.warning("%s", msg)


def _detect(files: list[str]) -> Kind:
    if files and all(_has_ext(f, JSONL_EXTS) for f in files):
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
    files = select_files(_walk(root, d.exclude), d.tree)  # --include/--exclude
    kind: str = d.source_type
    if kind == "auto":
        kind, files = _detect_records(root, files, d.notes)
    if kind == "files":
        files = _without_shard_sets(root, files, d.notes)
        if d.source_type == "auto":
            _refuse_strays(root, [f for f in files if not _is_doc(f)])
        return _tree_units(root, files, d)
    if kind == "table":
        return [
            u
            for rel in files
            if _has_ext(rel, TABLE_EXTS)
            for u in table_units(os.path.join(root, rel), _strip_ext(rel, TABLE_EXTS))
        ]
    exts = JSONL_EXTS if kind == "jsonl" else SHARD_SUFFIXES
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
    if source_type in ("auto", "jsonl") and _has_ext(base, JSONL_EXTS):
        return Unit("jsonl", path, size, _strip_ext(base, JSONL_EXTS))
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
    shards (and their manifests and indexes) as shards, anything else as a file tree,
    except one whose files (documents aside) are at least half records with others beside
    them: a :class:`ConfigError` naming the others. The ``tree`` options' include/exclude
    patterns select a folder's files before it is read.
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
