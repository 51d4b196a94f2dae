"""Parquet and Arrow files as build inputs: what they are and how they split (row groups).

The reading itself is :mod:`shardkit.write.inputs.tables`; this is what discovery needs, below
:mod:`shardkit.write.inputs.sources`. pyarrow is the optional extra ``shardkit[parquet]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, WriterError

__all__ = [
    "TABLE_EXTS",
    "byte_slices",
    "is_parquet",
    "one_line",
    "pyarrow_module",
    "row_sizes",
    "table_parts",
]

TABLE_EXTS = (".parquet", ".arrow", ".feather", ".ipc")


def pyarrow_module() -> Any:
    """pyarrow (with its ipc and parquet modules), or a ConfigError naming the extra."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(
            "reading Parquet or Arrow files needs pyarrow: pip install 'shardkit[parquet]'"
        ) from None
    return pyarrow


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (pyarrow's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _column_sizes(col: Any, pa: Any, pc: Any) -> np.ndarray:
    """The bytes each row of one column holds once decoded (text and binary exactly,
    dictionaries by their values, a ``{bytes, path}`` struct by its bytes, the rest evenly)."""
    n = len(col)
    t = col.type
    text = (
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_binary,
        pa.types.is_large_binary,
    )
    if pa.types.is_dictionary(t) and any(k(t.value_type) for k in text):
        values = pc.binary_length(col.dictionary).fill_null(0).to_numpy(zero_copy_only=False)
        idx = col.indices.fill_null(0).to_numpy(zero_copy_only=False)
        out: np.ndarray = values[idx] if len(values) else np.zeros(n, np.int64)
        return out
    if any(k(t) for k in text):
        plain: np.ndarray = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        return plain
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
        inner = col.field("bytes")
        if any(k(inner.type) for k in text):
            blob: np.ndarray = pc.binary_length(inner).fill_null(0).to_numpy(zero_copy_only=False)
            return blob
    return np.full(n, col.nbytes // max(n, 1), np.int64)


def row_sizes(batch: Any) -> np.ndarray:
    """About how many bytes each row of a record batch holds once decoded."""
    pa = pyarrow_module()
    import pyarrow.compute as pc

    total = np.zeros(batch.num_rows, np.int64)
    for col in batch.columns:
        total += _column_sizes(col, pa, pc).astype(np.int64)
    return total


def byte_slices(sizes: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` runs of rows whose sizes add up to at most ``budget`` (a row over
    it is a run of its own)."""
    start, acc = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > start and acc + size > budget:
            yield start, i
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        yield start, len(sizes)


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def table_parts(path: str) -> list[tuple[int, int]]:
    """``(group, size)`` of each unit of a table file: a Parquet file's row groups (sizes
    spread by their bytes, adding up to the file's size), or ``(-1, size)`` for an Arrow
    file, read whole."""
    pa = pyarrow_module()
    size = os.path.getsize(path)
    if not is_parquet(path):
        return [(-1, size)]
    try:
        with pa.parquet.ParquetFile(path) as pf:
            meta = pf.metadata
    except (OSError, pa.ArrowException) as exc:  # damaged data, not a usage error: exit 1
        raise WriterError(f"{path}: cannot read as Parquet: {one_line(exc)}") from exc
    groups = meta.num_row_groups
    if groups == 0:
        return [(0, size)]
    weights = [max(1, meta.row_group(i).total_byte_size) for i in range(groups)]
    total = sum(weights)
    sizes = [size * w // total for w in weights]
    sizes[-1] += size - sum(sizes)
    return list(enumerate(sizes))
