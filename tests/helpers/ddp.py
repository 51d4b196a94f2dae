"""Data sets and pipelines for the DDP contract tests: pipelines that make ranks consume
at different rates (a filter, a damaged shard under a skip policy, token packing, a mix)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import shardkit as sk
from shardkit import ShardDataset
from tests.helpers.data import make_shards
from tests.helpers.servers import free_port

__all__ = [
    "DOC_LENGTHS",
    "NAMES",
    "SIZES",
    "contract_pipeline",
    "free_port",
    "ident",
    "keep",
    "kept",
    "make_data",
]

SIZES = [5, 17, 9, 23, 2, 11, 14]  # 81 samples: 27 per rank of 3
DOC_LENGTHS = np.random.default_rng(1).integers(3, 41, size=120).tolist()
NAMES = ["plain", "filter", "pack", "mix"]


def make_data(root: Path) -> None:
    """Plain shards, a copy with one shard truncated mid-way, another set, token documents."""
    make_shards(root / "plain", SIZES)
    make_shards(root / "other", [6, 9, 4], prefix="other", seed=3)
    damaged = make_shards(root / "damaged", SIZES)
    shard = root / "damaged" / damaged.shards[3].url
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with sk.ShardWriter(root / "docs", maxcount=20) as w:
        for i, n in enumerate(DOC_LENGTHS):  # document i is the token i, n times
            w.write({"__key__": f"doc-{i:04d}", "tokens.npy": np.full(n, i, dtype=np.int32)})


def keep(sample: dict[str, Any]) -> bool:
    return int(str(sample["__key__"])[-2:]) % 3 != 0


def kept() -> set[str]:
    """What the filter keeps of the plain set, as :func:`ident` names it."""
    out, k = set(), 0
    for shard, n in enumerate(SIZES):
        for _ in range(n):
            if k % 100 % 3 != 0:
                out.add(f"data-{shard:06d}.tar:sample-{k:08d}")
            k += 1
    return out


def ident(batch: Any) -> list[str]:
    """What a batch holds, as strings: sample keys with their shard, or packed tokens."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):  # pack_tokens: one row per sequence
        return [" ".join(str(int(t)) for t in row) for row in batch]
    return [f"{u.rsplit('/', 1)[-1]}:{k}" for k, u in zip(batch[0], batch[1], strict=True)]


def contract_pipeline(
    name: str,
    root: Path,
    *,
    policy: str = "raise",
    damaged: bool = False,
    rank: int | None = None,
    world: int | None = None,
    seed: int = 7,
) -> ShardDataset:
    """Pipeline ``name`` over the plain (or damaged) set, split by node."""
    plain = "damaged" if damaged else "plain"

    def src(d: str) -> ShardDataset:
        ds = ShardDataset(str(root / d / "manifest.json"), seed=seed, handler=policy)
        return ds.split_by_node(rank, world)

    if name == "plain":
        return src(plain).shuffle(8).to_tuple("__key__", "__url__").batched(4)
    if name == "filter":
        ds = src(plain).shuffle(8).select(keep)
        return ds.to_tuple("__key__", "__url__").batched(3)
    if name == "pack":
        return src("docs").shuffle(6).decode().pack_tokens("tokens.npy", 16).batched(2)
    if name == "mix":
        a, b = src(plain).shuffle(8), src("other")
        return sk.mix([a, b], [0.6, 0.4], seed=3).to_tuple("__key__", "__url__").batched(4)
    raise AssertionError(name)
