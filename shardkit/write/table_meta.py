"""Parquet and Arrow files as build inputs: what they are and how they split (row groups).

The reading itself is :mod:`shardkit.write.tables`; this is what discovery needs, below
:mod:`shardkit.write.sources`. pyarrow is the optional extra ``shardkit[parquet]``.
"""

from __future__ import annotations

import os
from typing import Any

from shardkit.errors import ConfigError, WriterError

__all__ = ["TABLE_EXTS", "is_parquet", "one_line", "pyarrow_module", "table_parts"]

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
