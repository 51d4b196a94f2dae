"""SPDL and torchdata.nodes loaders over the same WebDataset tar shards (bench venv only).

Neither library has a WebDataset reader of its own: both are pipeline builders that a user
feeds with their own source. So each reads the shardkit-written tar shards with the tar
parser it has or the user would reach for (SPDL: ``spdl.io.iter_tarfile``; torchdata.nodes:
Python's ``tarfile``), groups members into samples by key as WebDataset does, and decodes
json -> dict, npy -> array, cls -> int as every other contender does. Batches of 32 go
through torch's ``default_collate``, as a ``torch.utils.data.DataLoader`` user's would.

- SPDL, two ways it documents: ``spdl.pipeline.PipelineBuilder`` (the stages its own
  ``DataLoader`` builds, plus ``disaggregate``): shard paths -> one shard's decoded samples
  per task on a pool of 2 threads -> flattened -> batches of 32 -> collate ("spdl"); and
  ``spdl.dataloader.DataLoader`` with a generator preprocessor, whose every ``next()`` is
  a task of its own ("spdl DataLoader": the first batch sooner, each sample a hand-off).
- torchdata.nodes (its documented nodes: ``IterableWrapper`` -> ``ParallelMapper`` ->
  ``Unbatcher`` -> ``Batcher`` -> ``Mapper`` -> ``Loader``): shard paths mapped to their
  decoded samples in 2 worker processes (``method="process"``), flattened, batched by 32
  (``drop_last=False``: every sample counts), collated in the main process.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any


def decode_field(field: str, raw: bytes, load_npy: Any = None) -> Any:
    """One field as every contender decodes it: json -> dict, npy -> array, cls -> int."""
    if field == "json" or field.endswith(".json"):
        return json.loads(raw)
    if field.endswith("npy"):
        if load_npy is not None:
            return load_npy(raw)
        import numpy as np

        return np.load(io.BytesIO(raw), allow_pickle=False)
    if field == "cls" or field.endswith(".cls"):
        return int(raw)
    return raw


def group_samples(
    members: Iterable[tuple[str, bytes]], load_npy: Any = None
) -> Iterator[dict[str, Any]]:
    """(name, bytes) members of a tar in order -> decoded samples, one per key (the part
    of the name before the first dot, as WebDataset groups them)."""
    sample: dict[str, Any] | None = None
    for name, raw in members:
        key, _, field = name.partition(".")
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                yield sample
            sample = {"__key__": key}
        sample[field] = decode_field(field, raw, load_npy)
    if sample is not None:
        yield sample


def _collate(samples: list[dict[str, Any]]) -> Any:
    from torch.utils.data import default_collate

    return default_collate(samples)


# -- SPDL ----------------------------------------------------------------------------------
def spdl_samples(path: str) -> Iterator[dict[str, Any]]:
    """One shard's decoded samples (``iter_tarfile`` on the file, ``spdl.io.load_npy`` for
    the arrays): the generator preprocessor of ``spdl.dataloader.DataLoader``, which SPDL
    steps one ``next()`` per thread-pool task."""
    import spdl.io

    with open(path, "rb") as f:
        yield from group_samples(spdl.io.iter_tarfile(f), spdl.io.load_npy)


def spdl_shard(path: str) -> list[dict[str, Any]]:
    """One shard -> the list of its decoded samples: one thread-pool task per shard."""
    return list(spdl_samples(path))


class SpdlLoader:
    """SPDL's ``PipelineBuilder``, built afresh for each epoch as its ``DataLoader`` does:
    shard paths -> ``pipe(spdl_shard, concurrency=workers)`` -> ``disaggregate()`` ->
    ``aggregate(batch)`` -> ``pipe(collate)`` -> sink, on ``num_threads=workers`` threads."""

    def __init__(self, spec: dict[str, Any]) -> None:
        # imported before the clock, as the other loaders' are (torch: for the collate)
        import spdl.io  # noqa: F401
        import torch.utils.data  # noqa: F401

        self.spec = spec

    def __iter__(self) -> Iterator[Any]:
        from spdl.pipeline import PipelineBuilder

        workers = self.spec["workers"]
        pipeline = (
            PipelineBuilder()
            .add_source(self.spec["urls"])
            .pipe(spdl_shard, concurrency=workers)
            .disaggregate()
            .aggregate(self.spec["batch"])
            .pipe(_collate, concurrency=workers)
            .add_sink(3)
            .build(num_threads=workers)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()


def loader_spdl(spec: dict[str, Any]) -> Iterable[Any]:
    return SpdlLoader(spec)


def loader_spdl_dataloader(spec: dict[str, Any]) -> Iterable[Any]:
    """SPDL's own ``DataLoader``: a generator preprocessor (a shard's samples, one per
    thread-pool task), ``batch_size`` 32, collate as the aggregator, ``num_threads`` 2."""
    import spdl.io  # noqa: F401 - imported before the clock, as the other loaders' are
    import torch.utils.data  # noqa: F401
    from spdl.dataloader import DataLoader

    return DataLoader(
        spec["urls"],
        preprocessor=spdl_samples,
        batch_size=spec["batch"],
        aggregator=_collate,
        num_threads=spec["workers"],
    )


# -- torchdata.nodes -----------------------------------------------------------------------
def tarfile_shard(path: str) -> list[dict[str, Any]]:
    """torchdata.nodes map function: one shard -> its decoded samples (Python's tarfile)."""

    def members() -> Iterator[tuple[str, bytes]]:
        with tarfile.open(path, "r:") as tf:
            for info in tf:
                f = tf.extractfile(info) if info.isfile() else None
                if f is not None:
                    yield info.name, f.read()

    return list(group_samples(members()))


def loader_torchdata(spec: dict[str, Any]) -> Iterable[Any]:
    from torchdata import nodes

    node: Any = nodes.IterableWrapper(spec["urls"])
    node = nodes.ParallelMapper(
        node, map_fn=tarfile_shard, num_workers=spec["workers"], method="process"
    )
    node = nodes.Unbatcher(node)
    node = nodes.Batcher(node, batch_size=spec["batch"], drop_last=False)
    node = nodes.Mapper(node, _collate)
    return nodes.Loader(node)
