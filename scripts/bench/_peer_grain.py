"""Grain's DataLoader over ArrayRecord files written from the same samples (bench venv only).

ArrayRecord is the file format Grain documents for its ``DataLoader`` (``ArrayRecordDataSource``,
random access by record index); ``array_record`` comes with grain. Each sample is one record:
its fields encoded as shardkit stores them (json bytes, npy bytes, the class as text), pickled
together as a dict, in files of about ``--shard-size`` (``group_size:1``, as Grain's docs
write files for random access). The loader is the documented one: ``grain.python.DataLoader``
with ``ArrayRecordDataSource``, an ``IndexSampler`` (in order, no shuffle, one epoch), a
``MapTransform`` that decodes the fields (json -> dict, npy -> array, cls -> int) and
``Batch(32)`` as operations, ``worker_count=2`` (Grain's worker processes).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from typing import Any

import grain.python as grain
from _common import Dataset

from shardkit.format.codecs import encode_field


def write_array_record(ds: Dataset, out: str, shard_bytes: int) -> list[str]:
    """The samples as ArrayRecord files of about ``shard_bytes``; returns their paths."""
    from array_record.python.array_record_module import ArrayRecordWriter

    paths: list[str] = []
    writer: Any = None
    size = 0
    for s in ds.samples:
        key = s["__key__"]
        fields = {f: encode_field(key, f, v) for f, v in s.items() if f != "__key__"}
        record = pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)
        if writer is None or size + len(record) > shard_bytes:
            if writer is not None:
                writer.close()
            paths.append(os.path.join(out, f"data-{len(paths):06d}.array_record"))
            writer, size = ArrayRecordWriter(paths[-1], "group_size:1"), 0
        writer.write(record)
        size += len(record)
    if writer is not None:
        writer.close()
    return paths


class Decode(grain.MapTransform):  # type: ignore[misc]
    """A record -> the decoded sample."""

    def map(self, element: bytes) -> dict[str, Any]:
        from _peer_tars import decode_field

        fields = pickle.loads(element)  # records this benchmark wrote itself
        return {f: decode_field(f, raw) for f, raw in fields.items()}


def loader_grain(spec: dict[str, Any]) -> Iterable[Any]:
    source = grain.ArrayRecordDataSource(spec["paths"])
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=grain.NoSharding(),
        shuffle=False,
        num_epochs=1,
        seed=0,
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[Decode(), grain.Batch(spec["batch"])],
        worker_count=spec["workers"],
    )
