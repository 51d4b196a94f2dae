"""Reading a build's input units into samples (see :mod:`shardkit.write.inputs.sources` for units).

One reader per unit kind: JSONL lines (plain, ``.zst``, ``.gz``), a file-tree sample
(optionally with its images re-encoded), an existing tar shard, or the samples a build
function yields for one input. Record readers turn a bad record into a
:class:`~shardkit.write.inputs.sources.BadRecord` when ``on_error="skip"``; a new record source (a
table format) follows :func:`_read_jsonl`'s pattern.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from shardkit._types import Sample
from shardkit.errors import ShardFormatError, WriterError
from shardkit.format.codecs import encode_field
from shardkit.format.images import IMAGE_EXTS, reencode_image
from shardkit.format.tario.reader import read_shard
from shardkit.format.tario.writer import check_key
from shardkit.format.zstd import zstd_reader
from shardkit.write.inputs.image_check import image_problem
from shardkit.write.inputs.sources import BadRecord, Located, SourceError, SourceOptions, Unit

__all__ = ["read_units"]


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
            try:
                value = np.asarray(value, dtype=fm.dtype)
            except (OverflowError, ValueError, TypeError) as exc:
                raise ValueError(f"field {fm.name!r} does not fit {fm.dtype}: {exc}") from None
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
    if unit.path.lower().endswith(".gz"):  # by name: closing it closes the file (fileobj= did not)
        f.close()
        return io.BufferedReader(gzip.GzipFile(unit.path, mode="rb"), buffer_size=1 << 20)
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
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    try:
        f = _open_text(unit)
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror}", path=unit.path) from exc
    lineno = 0
    try:
        with f:
            for lineno, line in enumerate(_bounded_lines(f, opts.max_record), start=1):
                if isinstance(line, int):
                    yield from _too_long(unit, opts, lineno, line)
                else:
                    yield from _jsonl_line(unit, opts, skip, line, lineno)
    except (OSError, EOFError, zlib.error, ShardFormatError) as exc:
        # a truncated or corrupt .gz/.zst stream: name the file and the last good line
        raise SourceError(
            f"corrupt or truncated after line {lineno}: {exc}", path=unit.path
        ) from exc


def _bounded_lines(f: io.BufferedIOBase, limit: int) -> Iterator[bytes | int]:
    """The lines of ``f``; a line longer than ``limit`` bytes comes as its length, read
    through in 1 MiB steps and never held whole (a 600 MB line took 2.46 GB)."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        n = len(line)
        del line
        while chunk := f.readline(1 << 20):
            n += len(chunk)
            if chunk.endswith(b"\n"):
                break
        yield n


def _too_long(
    unit: Unit, opts: SourceOptions, lineno: int, n: int
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    reason = (
        f"the line is {n} bytes, more than the record limit of {opts.max_record} (--max-record)"
    )
    if opts.on_error == "raise":
        raise SourceError(reason, path=unit.path, line=lineno)
    yield BadRecord(unit.path, "line", lineno, reason), n


def _jsonl_line(
    unit: Unit, opts: SourceOptions, skip: _Skip, line: bytes, lineno: int
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    raw = line.strip()
    # with on_error="skip" a bad line is no sample: a resume must parse to count samples
    if not raw or (opts.on_error == "raise" and skip.take()):
        yield None, len(line)
        return
    try:
        rec = _loads(raw)
        if (opts.fields or opts.key_field is not None) and not isinstance(rec, dict):
            raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
        key = _jsonl_key(rec, unit, lineno, opts)
        sample = _jsonl_sample(rec, raw, key, opts)
    except (ValueError, WriterError) as exc:
        if opts.on_error == "raise":
            raise SourceError(_describe(exc), path=unit.path, line=lineno) from exc
        yield BadRecord(unit.path, "line", lineno, _describe(exc)), len(line)
        return
    yield (None if skip.take() else Located(sample, f"{unit.path} line {lineno}")), len(line)


def _loads(raw: bytes) -> Any:
    """``json.loads``, with nesting too deep for the parser a ValueError saying so (it was
    a RecursionError, which ``on_error="skip"`` could not skip)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(
            f"JSON nested too deeply (past about {sys.getrecursionlimit()} levels)"
        ) from None


def _describe(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start} of the line"
    return str(exc)


def _read_tree(unit: Unit, opts: SourceOptions) -> Sample:
    sample: Sample = {"__key__": unit.name}
    for fname, rel in unit.members:
        path = os.path.join(unit.path, rel)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", path=path) from exc
        ext = rel.rsplit(".", 1)[-1].lower()
        bad = image_problem(ext, data, opts.check_images)
        if bad is not None:
            raise SourceError(bad, path=path)
        if opts.image is not None and ext in IMAGE_EXTS:
            try:
                data = reencode_image(data, ext, opts.image)
            except (OSError, ValueError, SyntaxError) as exc:  # Pillow's errors for bad files
                raise SourceError(f"cannot re-encode the image: {exc}", path=path) from exc
        sample[fname] = data
    first = os.path.join(unit.path, unit.members[0][1]) if unit.members else unit.path
    return Located(sample, first)


def _tree_sample(
    unit: Unit, opts: SourceOptions, skip: _Skip
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    if unit.payload is not None:  # left out by discovery (--require-fields): reported
        yield BadRecord(unit.path, "sample", unit.name, str(unit.payload)), unit.size
        return
    # with on_error="skip" a bad sample is no sample: a resume must read to count samples
    if opts.on_error == "raise" and skip.take():
        yield None, unit.size
        return
    try:
        sample = _read_tree(unit, opts)
    except SourceError as exc:
        if opts.on_error == "raise":
            raise
        yield BadRecord(exc.path or unit.path, "sample", unit.name, str(exc)), unit.size
        return
    yield (None if skip.take() else sample), unit.size


def _read_call(
    unit: Unit, opts: SourceOptions, skip: _Skip
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    assert opts.fn is not None
    try:
        for j, item in enumerate(opts.fn(unit.payload)):
            if not isinstance(item, Mapping):
                raise SourceError(
                    f"the build function yielded a {type(item).__name__}, not a dict sample",
                    path=unit.path,
                )
            sample = dict(item)
            sample.setdefault("__key__", f"{unit.name}/{j:06d}")
            yield (None if skip.take() else sample), 0
    except SourceError:
        raise
    except Exception as exc:
        if opts.on_error == "raise":
            raise
        reason = f"{type(exc).__name__}: {exc}"
        yield BadRecord(unit.path, "input", int(unit.name), reason), 0


def _read_tar(unit: Unit, skip: _Skip, opts: SourceOptions) -> Iterator[tuple[Sample | None, int]]:
    for sample in read_shard(unit.path, max_member=opts.max_member, policy=opts.tar_policy):
        nbytes = sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
        yield (None if skip.take() else Located(sample, unit.path)), nbytes


def _read_unit(
    unit: Unit, opts: SourceOptions, skip: _Skip
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    if unit.kind == "files":
        yield from _tree_sample(unit, opts, skip)
    elif unit.kind == "jsonl":
        yield from _read_jsonl(unit, opts, skip)
    elif unit.kind == "call":
        yield from _read_call(unit, opts, skip)
    elif unit.kind == "table":
        from shardkit.write.inputs.tables import read_table

        yield from read_table(unit, opts, skip)
    else:
        yield from _read_tar(unit, skip, opts)


def read_units(
    units: Iterable[Unit], opts: SourceOptions | None = None, *, skip: int = 0
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    """Yield ``(sample, input_bytes)`` for every sample of ``units``, in order.

    The first ``skip`` samples (those a resumed build already holds) are yielded as
    ``None`` without being decoded; ``None`` also carries bytes that hold no sample (blank
    lines). With ``opts.on_error == "skip"`` a bad record comes as a :class:`BadRecord`
    (every run: a resumed build's report is whole). The input bytes of a unit add up to
    its size on disk.
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
