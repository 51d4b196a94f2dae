"""Parquet and Arrow IPC files as build sources: one sample per row, read in record batches.

Rows become samples as data sets on the Hugging Face Hub lay them out:

- an ``Image``/``Audio`` column (a struct ``{bytes, path}``) becomes the member
  ``{col}.{ext}``, ``ext`` taken from ``path`` (``image.jpg``), or from the bytes' magic
  when there is no path (png, jpg, gif, webp, wav, flac, ogg, mp3); a row whose struct holds
  only a path (a file elsewhere) is an error naming the row and column;
- a binary column becomes the member named by the column (a column ``jpg`` gives
  ``{key}.jpg``, as WebDataset names fields);
- a column mapped with ``--field NAME=EXT[:DTYPE]`` becomes ``NAME.EXT`` (as for JSONL);
- every other column goes into the ``json`` member, one object per row.

A null leaves its member out of that sample. Keys are ``{file stem}/{row:09d}`` (the row
in the whole file, from 0) unless ``--key-field`` names a column (kept in ``json`` too, as
for JSONL); messages and reports count rows from 1, as JSONL lines. A Parquet file is one unit per
row group, so ``--workers`` and ``--part`` split a big file; an Arrow file is one unit.
Memory stays bounded: batches of about 64 MB (rows per batch from the row group's size),
dictionary-encoded text kept as one dictionary, rows turned into Python objects 64 MB at a
time, and a row over ``max_record`` bytes a bad record. pyarrow is the optional extra
``shardkit[parquet]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit._types import Sample
from shardkit.errors import ConfigError, WriterError
from shardkit.format.codecs import encode_field
from shardkit.format.tario.writer import check_field, check_key
from shardkit.write.inputs.image_check import image_problem
from shardkit.write.inputs.sources import BadRecord, Located, SourceError, SourceOptions, Unit
from shardkit.write.inputs.table_meta import (
    byte_slices,
    is_parquet,
    one_line,
    pyarrow_module,
    row_sizes,
)

__all__ = ["read_table"]

_BATCH_ROWS = 1024
_BATCH_BYTES = 64 << 20  # rows turned into Python objects at once: at most this many bytes


def _text_columns(path: str, pa: Any) -> list[str]:
    """The top-level string and binary columns (read as dictionaries where encoded so)."""
    schema = pa.parquet.read_schema(path)
    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)
    return [f.name for f in schema if any(k(f.type) for k in kinds)]


def _batch_rows(meta: Any, group: int, rows: int) -> int:
    """Rows per batch so that one batch holds about ``_BATCH_BYTES`` (from the row
    group's uncompressed size), at most ``_BATCH_ROWS``."""
    if group < 0 or rows <= 0:
        return _BATCH_ROWS
    per_row = max(1, int(meta.row_group(group).total_byte_size) // rows)
    return max(1, min(_BATCH_ROWS, _BATCH_BYTES // per_row))


@dataclass(frozen=True)
class _Layout:
    """What each column becomes: a blob struct's member, a binary member, or json."""

    blobs: tuple[str, ...]  # Image/Audio-like structs {bytes, path}
    binary: tuple[str, ...]


def _layout(schema: Any, pa: Any) -> _Layout:
    blobs, binary = [], []
    for f in schema:
        t = f.type
        if pa.types.is_dictionary(t):  # text read as a dictionary is still text
            t = t.value_type
        if pa.types.is_struct(t):
            names = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
            if "bytes" in names and "path" in names and _is_binary(names["bytes"], pa):
                blobs.append(f.name)
        elif _is_binary(t, pa):
            binary.append(f.name)
    return _Layout(tuple(blobs), tuple(binary))


def _is_binary(t: Any, pa: Any) -> bool:
    return bool(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    )


def _ipc_batches(source: Any, pa: Any) -> tuple[Any, Iterator[Any]]:
    """The schema and record batches of an Arrow IPC file, or of an IPC stream."""
    try:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:  # the IPC stream format (no footer)
        source.seek(0)
        stream = pa.ipc.open_stream(source)
        return stream.schema, iter(stream)


def read_table(
    unit: Unit, opts: SourceOptions, skip: Any
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    """Yield ``(sample, input_bytes)`` for every row of a table unit (``skip`` as JSONL)."""
    pa = pyarrow_module()
    try:
        if is_parquet(unit.path):
            # dictionary-encoded text stays one dictionary, not a copy per row (1,500 rows
            # of one 1 MB string in a 523-byte file took 1.13 GB)
            text = _text_columns(unit.path, pa)
            with pa.parquet.ParquetFile(unit.path, read_dictionary=text) as pf:
                meta = pf.metadata
                groups = [unit.group] if meta.num_row_groups else []
                first = sum(meta.row_group(i).num_rows for i in range(max(unit.group, 0)))
                rows = meta.row_group(unit.group).num_rows if groups else 0
                batches = pf.iter_batches(
                    batch_size=_batch_rows(meta, unit.group, rows),
                    row_groups=groups,
                    use_threads=False,
                )
                yield from _rows(unit, opts, skip, pf.schema_arrow, batches, first, rows)
        else:
            with pa.memory_map(unit.path) as source:
                schema, batches = _ipc_batches(source, pa)
                yield from _rows(unit, opts, skip, schema, batches, 0, 0)
    except (OSError, pa.ArrowException) as exc:  # a damaged file: pyarrow's IOError too
        where = f"row group {unit.group}: " if unit.group >= 0 else ""
        raise SourceError(f"{where}cannot read: {one_line(exc)}", path=unit.path) from exc


def _rows(
    unit: Unit,
    opts: SourceOptions,
    skip: Any,
    schema: Any,
    batches: Iterator[Any],
    row: int,
    rows_total: int,
) -> Iterator[tuple[Sample | BadRecord | None, int]]:
    layout = _layout(schema, pyarrow_module())
    _check_options(schema, opts, unit.path)
    for batch in batches:
        # an Arrow file's row count is not known up front: its batches' bytes stand in
        per_row = batch.nbytes // max(batch.num_rows, 1)
        step = unit.size // rows_total if rows_total else per_row
        sizes = row_sizes(batch)
        for start, stop in byte_slices(sizes, _BATCH_BYTES):
            for i, rec in enumerate(batch.slice(start, stop - start).to_pylist(), start):
                if sizes[i] > opts.max_record:
                    yield _too_big(unit, opts, row + 1, int(sizes[i])), step
                elif skip.take():
                    yield None, step
                else:
                    where = f"row {row + 1}"  # rows count from 1, as JSONL lines do
                    try:
                        sample = _row_sample(rec, row, unit, opts, layout)
                    except (ValueError, TypeError, WriterError) as exc:
                        if opts.on_error == "raise" or not isinstance(exc, _BadImage):
                            raise SourceError(f"{where}: {exc}", path=unit.path) from exc
                        yield BadRecord(unit.path, "row", row + 1, str(exc)), step
                    else:
                        yield Located(sample, f"{unit.path} {where}"), step
                row += 1


def _table_check(opts: SourceOptions) -> str:
    """Table image cells (binary columns and Image structs named like an image) are
    checked as folder files are: ``header`` by default, ``decode`` or ``off`` on request."""
    return opts.check_images


class _BadImage(ValueError):
    """An image cell that does not pass ``check_images`` (skippable with on_error)."""


def _too_big(unit: Unit, opts: SourceOptions, row: int, size: int) -> BadRecord:
    reason = f"row {row} holds {size} bytes, more than the record limit of {opts.max_record}"
    if opts.on_error == "raise":
        raise SourceError(reason + " (--max-record)", path=unit.path)
    return BadRecord(unit.path, "row", row, reason)


def _check_options(schema: Any, opts: SourceOptions, path: str) -> None:
    names = set(schema.names)
    for fm in opts.fields:
        if fm.name not in names:
            raise ConfigError(f"{path}: --field {fm.name!r}: no such column ({_cols(names)})")
    if opts.key_field is not None and opts.key_field not in names:
        raise ConfigError(f"{path}: --key-field {opts.key_field!r}: no such column")


def _cols(names: set[str]) -> str:
    return "columns: " + ", ".join(sorted(names)[:20])


def _row_sample(
    rec: dict[str, Any], row: int, unit: Unit, opts: SourceOptions, layout: _Layout
) -> Sample:
    key = _key(rec, row, unit, opts)
    sample: Sample = {"__key__": key}
    owners: dict[str, str] = {}  # member -> the column it came from, for a collision
    mapped = {fm.name: fm for fm in opts.fields}
    rest: dict[str, Any] = {}
    for col, value in rec.items():  # the key column stays in json, as a JSONL record's does
        fm = mapped.get(col)
        if fm is not None:
            if value is not None:
                if fm.dtype is not None:
                    try:
                        value = np.asarray(value, dtype=fm.dtype)
                    except (OverflowError, ValueError, TypeError) as exc:  # as for JSONL
                        raise ValueError(f"field {col!r} does not fit {fm.dtype}: {exc}") from None
                _put(sample, fm.field, encode_field(key, fm.field, value), col, owners)
        elif col in layout.blobs:
            _add_blob(sample, col, value, owners, _table_check(opts))
        elif col in layout.binary:
            if value is not None:
                check_field(key, col)
                bad = image_problem(col, bytes(value), _table_check(opts))
                if bad is not None:
                    raise _BadImage(f"column {col!r}: {bad}")
                _put(sample, col, bytes(value), col, owners)
        else:
            rest[col] = value
    if rest:
        data = json.dumps(rest, ensure_ascii=False, default=str).encode()
        _put(sample, "json", data, f"the other columns ({', '.join(rest)})", owners)
    return sample


def _put(sample: Sample, field: str, data: bytes, source: str, owners: dict[str, str]) -> None:
    """Set a member, refusing a second column that names the same one (one was dropped)."""
    if field in sample:
        raise WriterError(
            f"member {field!r} comes from both {owners[field]} and {source}: rename a column, "
            "or map it with --field"
        )
    sample[field] = data
    owners[field] = source if source.startswith("the other") else f"column {source!r}"


def _key(rec: dict[str, Any], row: int, unit: Unit, opts: SourceOptions) -> str:
    """``{stem}/{row:09d}``, or the ``--key-field`` column (the rule JSONL lines follow)."""
    if opts.key_field is None:
        return f"{unit.name}/{row:09d}"
    value = rec.get(opts.key_field)
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"key column {opts.key_field!r} is missing or not a string: {value!r}")
    check_key(str(value))
    return str(value)


def _add_blob(
    sample: Sample, col: str, value: Any, owners: dict[str, str], check: str = "header"
) -> None:
    """An Image/Audio struct: its bytes as ``{col}.{ext}``, ext from its path."""
    if value is None:
        return
    data, path = value.get("bytes"), value.get("path")
    if data is None:
        if path is None:
            return
        raise ValueError(f"column {col!r} refers to the file {path!r} instead of holding bytes")
    base = os.path.basename(str(path or ""))
    ext = base.rsplit(".", 1)[-1].lower() if "." in base else _sniff(data)
    field = f"{col}.{ext}"
    check_field(str(sample["__key__"]), field)
    bad = image_problem(field, bytes(data), check)
    if bad is not None:
        raise _BadImage(f"column {col!r}: {bad}")
    _put(sample, field, bytes(data), col, owners)


_MAGIC = (
    (b"\x89PNG", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF8", "gif"),
    (b"fLaC", "flac"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
)


def _sniff(data: bytes) -> str:
    """The extension of an image or audio blob stored without a path (as ``datasets``
    stores a PIL image it encoded itself); ``bin`` when not known."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF":
        return {b"WEBP": "webp", b"WAVE": "wav"}.get(bytes(data[8:12]), "bin")
    return "bin"
