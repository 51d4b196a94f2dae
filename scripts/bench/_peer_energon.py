"""Megatron-Energon over the shardkit-written WebDataset shards (bench venv only).

Energon reads WebDataset tar shards once a ``.nv-meta`` folder describes them: its
``energon prepare`` tool (run non-interactively in the writing step, outside timing) indexes
every shard into ``index.sqlite`` and writes ``split.yaml`` and ``dataset.yaml``. The
dataset is prepared as a ``CrudeWebdataset`` (its documented way for samples that fit none
of its built-in sample types): energon's default ``SampleDecoder`` decodes the fields
(webdataset's autodecode: json -> dict, npy -> array, cls -> int) and a stateless cooker in
the task encoder keeps them as a dict. The loader is the documented one:
``get_val_dataset`` (one pass in order, no shuffle, no repeat: as every other contender
reads) with ``WorkerConfig(rank=0, world_size=1, num_workers=2)``, ``batch_size=32``,
then ``get_loader``; batches are collated by the default task encoder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from typing import Any


def prepare(shard_paths: list[str], out: str) -> None:
    """Hard-link the shards into ``out`` (the same files, the same page cache) and run
    ``energon prepare`` on it without questions: one split ``train`` holding every shard."""
    for p in shard_paths:
        os.link(p, os.path.join(out, os.path.basename(p)))
    energon = os.path.join(os.path.dirname(sys.executable), "energon")
    cmd = [energon, "prepare", out, "--non-interactive", "--no-progress"]
    cmd += ["--split-parts", "train:.*", "--sample-type", "CrudeWebdataset"]
    cmd += ["--num-workers", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not os.path.isdir(os.path.join(out, ".nv-meta")):
        raise RuntimeError(f"energon prepare failed:\n{proc.stdout}\n{proc.stderr}")


def _task_encoder() -> Any:
    from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless

    @stateless
    def cook(sample: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = basic_sample_keys(sample)
        out.update((k, v) for k, v in sample.items() if not k.startswith("__"))
        return out

    class Encoder(DefaultTaskEncoder):  # type: ignore[misc]
        cookers = (Cooker(cook),)

    return Encoder()


def loader_energon(spec: dict[str, Any]) -> Iterable[Any]:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"])
    ds = get_val_dataset(
        spec["dir"],
        split_part="train",
        worker_config=wc,
        batch_size=spec["batch"],
        task_encoder=_task_encoder(),
    )
    return get_loader(ds)
