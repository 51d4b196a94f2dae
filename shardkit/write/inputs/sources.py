"""Input readers for ``shardkit build``: file trees, JSONL files and existing tar shards.

A build's input is a list of :class:`Unit` s, the pieces of work that parallel workers
and ``--part`` split between them: one JSONL file, one tar shard, or one sample of a file
tree. :func:`~shardkit.write.inputs.discover.discover` turns the user's source arguments
into units in a fixed order;
:func:`read_units` turns units into samples (``{"__key__": key, field: bytes}``), each with
the number of input bytes it consumed, so a progress bar can show where the build is
(the readers are in :mod:`shardkit.write.inputs.records`).

File trees follow the WebDataset convention: ``dir/abc.jpg`` and ``dir/abc.json`` are the
fields ``jpg`` and ``json`` of the sample ``dir/abc`` (the key is split at the first dot of
the basename). Files are sorted by key, then field, so a sample's files are consecutive
and the order is the same on every run and every machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from shardkit.errors import ConfigError, WriterError
from shardkit.format.images import ImageOptions
from shardkit.format.tario.buffer import DEFAULT_MAX_MEMBER
from shardkit.format.tario.writer import check_field

__all__ = [
    "DEFAULT_MAX_RECORD",
    "JSONL_EXTS",
    "Located",
    "ON_ERROR",
    "SOURCE_TYPES",
    "BadRecord",
    "FieldMap",
    "SourceError",
    "SourceOptions",
    "Kind",
    "Unit",
    "parse_field_spec",
]

log = logging.getLogger(__name__)

Kind = Literal["files", "jsonl", "tar", "call", "table"]
SOURCE_TYPES = ("auto", "files", "jsonl", "tar", "table")
ON_ERROR = ("raise", "skip")
# .json.gz is how many corpora (C4, The Pile) ship JSON lines
JSONL_EXTS = (
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

    ``path`` names the input file and ``line`` the line when there is one; lines of
    JSONL and rows of tables count from 1 in every message and report.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = path or ""
        if line is not None:
            where += f" line {line}"
        super().__init__(f"{where.strip()}: {message}" if where else message)
        self.path = path
        self.line = line


class Located(dict[str, Any]):
    """A sample that knows where it was read (``where``: the file and line or row), so an
    error the writer finds later (a key twice in a shard) can name it; equal to its dict."""

    __slots__ = ("where",)

    def __init__(self, sample: dict[str, Any], where: str) -> None:
        super().__init__(sample)
        self.where = where


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
    :mod:`shardkit.write.inputs.tables`). ``size`` is the bytes it occupies on disk (1 for a
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
