"""A sample as tar members: each field encoded by its extension, a header and padding each
(what :class:`~shardkit.write.writer.shard_writer.ShardWriter` appends to a shard)."""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from typing import Any

from shardkit.errors import WriterError
from shardkit.format.codecs import encode_field
from shardkit.format.tario.writer import check_field, member_header, padding

__all__ = ["Pieces", "encode_sample", "gzip_writer"]

Pieces = list[bytes | bytearray | memoryview]


def gzip_writer(f: Any) -> gzip.GzipFile:
    """A whole-shard gzip stream over ``f``."""
    # mtime=0 and no name: the same samples give the same bytes on every run
    return gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=f, mtime=0)


def encode_sample(
    key: str, sample: Mapping[str, Any], good_fields: set[str], image_quality: int
) -> tuple[Pieces, int, dict[str, int]]:
    """The tar pieces of one sample, their total size, and each field's payload size;
    field names checked once (``good_fields`` remembers them), ``__`` fields left out."""
    pieces: Pieces = []
    size = 0
    sizes: dict[str, int] = {}
    for field, value in sample.items():
        if not isinstance(field, str):
            raise WriterError(f"sample {key!r}: field names must be strings, got {field!r}")
        if field.startswith("__"):
            continue
        if field not in good_fields:
            check_field(key, field)
            good_fields.add(field)
        data = encode_field(key, field, value, image_quality=image_quality)
        header = member_header(f"{key}.{field}", len(data))
        pad = padding(len(data))
        pieces.append(header)
        pieces.append(data)
        if pad:
            pieces.append(pad)
        size += len(header) + len(data) + len(pad)
        sizes[field] = len(data)
    if not sizes:
        raise WriterError(f"sample {key!r} has no fields")
    return pieces, size, sizes
