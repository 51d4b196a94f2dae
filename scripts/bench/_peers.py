"""The peers, each writing the same samples in its own format (benchmark venv only).

mosaicml-streaming imports torchvision at package import for its ``streaming.vision``
datasets; the only torchvision wheel on the index is a CUDA build that cannot load next to
the CPU torch, so setup.sh removes it and :func:`streaming` puts an empty
``streaming.vision`` module in place first. Nothing measured here touches it.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from _common import Dataset


def streaming() -> Any:
    """Import mosaicml-streaming without its torchvision-backed vision datasets."""
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming as mosaic

    return mosaic


def mds_columns(profile: str) -> dict[str, str]:
    """mosaic MDS column encodings for a profile (its native types for each field)."""
    if profile == "small":
        return {"json": "json", "tokens": "ndarray"}
    return {"bin": "bytes", "cls": "int", "json": "json"}


def mds_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """A shardkit/webdataset sample as an MDS row (the field names without extensions)."""
    return {k.split(".", 1)[0]: v for k, v in sample.items() if k != "__key__"}


def litdata_item(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample as a litdata item (a pytree: dicts, ints, str, bytes, numpy arrays)."""
    return mds_sample(sample)


def write_shardkit(ds: Dataset, out: str, shard_bytes: int, checksum: str = "sha256") -> None:
    import shardkit

    with shardkit.ShardWriter(out, maxsize=shard_bytes, checksum=checksum) as w:
        for s in ds.samples:
            w.write(s)


def write_wds(ds: Dataset, out: str, shard_bytes: int) -> None:
    import webdataset as wds

    pattern = os.path.join(out, "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_bytes, maxcount=1 << 40, verbose=0) as w:
        for s in ds.samples:
            w.write(s)


def write_mds(ds: Dataset, out: str, shard_bytes: int, hashes: list[str] | None = None) -> None:
    mosaic = streaming()
    cols = mds_columns(ds.profile)
    with mosaic.MDSWriter(out=out, columns=cols, size_limit=shard_bytes, hashes=hashes) as w:
        for s in ds.samples:
            w.write(mds_sample(s))


def write_litdata(ds: Dataset, out: str, shard_bytes: int) -> None:
    from litdata.streaming.writer import BinaryWriter

    w = BinaryWriter(out, chunk_bytes=shard_bytes)
    for i, s in enumerate(ds.samples):
        w[i] = litdata_item(s)
    w.done()
    w.merge()
