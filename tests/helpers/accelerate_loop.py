"""A training loop under accelerate with a WebLoader (run by torchrun: data manifest, out).

``accelerator.prepare`` leaves a WebLoader as it is (it is no torch DataLoader), so every
rank reads its own share of the data set split by node. Each rank writes the ids of every
batch it trained on to ``OUT.<rank>``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from accelerate import Accelerator

import shardkit as sk


def ident(sample: dict[str, Any]) -> int:
    return int(sample["json"]["id"])


def main() -> None:
    manifest, out = sys.argv[1], sys.argv[2]
    accelerator = Accelerator(cpu=True)
    ds = sk.ShardDataset(manifest, seed=1).split_by_node().shuffle(8).decode().map(ident)
    loader = sk.WebLoader(ds.batched(4, collate="torch"), num_workers=1)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, prepared = accelerator.prepare(model, opt, loader)
    assert prepared is loader, type(prepared)
    seen = []
    for batch in prepared:
        loss = model(batch.float().unsqueeze(-1)).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        seen.append(batch.tolist())
    with open(f"{out}.{accelerator.process_index}", "w", encoding="utf-8") as f:
        json.dump(seen, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
