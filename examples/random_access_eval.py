"""Evaluation with random access: a fixed subset, a DataLoader with workers, lookups by key.

    python examples/random_access_eval.py --data /tmp/sk-eval

``sk.IndexedShards`` is a map-style torch Dataset over the same shards a ``ShardDataset``
streams: ``ds[i]`` is sample ``i`` in manifest order, a slice is a lazy view, and
``ds.get(key)`` finds a sample by its ``__key__`` through the data set's key index (built on
first use, kept beside the manifest). Here a held-out slice is scored by a DataLoader
with 2 workers (under torchrun, add a ``DistributedSampler``), and the worst samples are
then fetched again by key to show them. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

import shardkit as sk


def make_data(root: Path, n: int) -> None:
    """``n`` samples: a json label and a small float vector each, in shards of 50."""
    if (root / "manifest.json").exists():
        return
    rng = np.random.default_rng(0)
    with sk.ShardWriter(root, maxcount=50) as w:
        for i in range(n):
            x = rng.normal(size=8).astype(np.float32)
            w.write({"__key__": f"doc-{i:05d}", "json": {"label": int(x.sum() > 0)}, "x.npy": x})


def features(sample: dict[str, Any]) -> tuple[str, torch.Tensor, int]:
    """Key, input and label (a module-level function: it pickles to the workers)."""
    return sample["__key__"], torch.from_numpy(sample["x.npy"]), sample["json"]["label"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--holdout", type=int, default=100, help="the last N samples are scored")
    a = p.parse_args()
    make_data(a.data, a.samples)
    ds = sk.IndexedShards(str(a.data / "manifest.json")).decode().map(features)
    held_out = ds[-a.holdout :]  # a view: nothing read until a worker asks
    model = torch.nn.Linear(8, 1)
    torch.nn.init.constant_(model.weight, 1.0)
    torch.nn.init.zeros_(model.bias)
    scored: list[tuple[float, str]] = []
    loader = DataLoader(held_out, batch_size=16, num_workers=2)
    with torch.no_grad():
        for keys, x, y in loader:
            p_pos = torch.sigmoid(model(x).squeeze(-1))
            loss = torch.nn.functional.binary_cross_entropy(p_pos, y.float(), reduction="none")
            scored += zip(loss.tolist(), keys, strict=True)
    worst = sorted(scored, reverse=True)[:3]
    again = [ds.get(key)[2] for _, key in worst]  # by key: the key index, one read each
    out = {
        "scored": len(scored),
        "first_key": scored[0][1],
        "mean_loss": sum(s for s, _ in scored) / len(scored),
        "worst": [k for _, k in worst],
        "worst_labels": again,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
