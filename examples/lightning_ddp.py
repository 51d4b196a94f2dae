"""A WebLoader in a LightningDataModule, DDP on CPU with 2 processes, resumable mid-epoch.

    torchrun --nproc_per_node=2 examples/lightning_ddp.py --data /tmp/sk-pl --run-dir /tmp/sk-pl-run

The data module returns a ``sk.WebLoader`` over a data set split by node: every rank reads
its own share, and every rank gets the same number of batches. Lightning saves the
loader's ``state_dict()`` in its checkpoints and loads it on ``fit(ckpt_path=...)``, so a
run stopped mid-epoch (``--stop-at 7``: it checkpoints there) and started again with
``--resume`` trains on exactly the batches the uninterrupted run would have.
``--seen-log`` records, per rank, the sample ids of every training step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch

import shardkit as sk


def make_data(root: Path, n: int) -> None:
    """``n`` samples ``{"id": i}`` in uneven shards (a real data set is built once)."""
    if (root / "manifest.json").exists():
        return
    with sk.ShardWriter(root, maxcount=23) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:06d}", "json": {"id": i}})


def ident(sample: dict[str, Any]) -> int:
    """A sample's id (a module-level function: it pickles to workers)."""
    return int(sample["json"]["id"])


class Data(L.LightningDataModule):
    """The shards, split by node, shuffled, in batches of ``batch``."""

    def __init__(self, root: Path, samples: int, batch: int, workers: int) -> None:
        super().__init__()
        self.root, self.samples, self.batch, self.workers = root, samples, batch, workers
        self.manifest = str(root / "manifest.json")

    def prepare_data(self) -> None:
        make_data(self.root, self.samples)  # Lightning: on one process, the others wait

    def train_dataloader(self) -> sk.WebLoader:
        ds = sk.ShardDataset(self.manifest, seed=5).split_by_node().shuffle(16).decode()
        ds = ds.map(ident).batched(self.batch, collate="torch")
        return sk.WebLoader(ds, num_workers=self.workers)


class Tiny(L.LightningModule):
    """A one-weight model that writes down the ids of every batch it trains on."""

    def __init__(self, log: str | None) -> None:
        super().__init__()
        self.w = torch.nn.Linear(1, 1)
        self.log_path = log

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.log_path is not None:
            with open(f"{self.log_path}.{self.global_rank}", "a", encoding="utf-8") as f:
                f.write(json.dumps(batch.tolist()) + "\n")
        x = batch.float().unsqueeze(-1) / 1000
        return ((self.w(x) - x) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--samples", type=int, default=160)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--seen-log", default=None)
    a = p.parse_args()
    ckpt = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=a.run_dir, every_n_train_steps=a.stop_at or None, save_last=True
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=a.epochs,
        max_steps=a.stop_at if a.stop_at and not a.resume else -1,
        callbacks=[ckpt],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = Data(a.data, a.samples, a.batch, a.workers)
    last = a.run_dir / "last.ckpt"
    trainer.fit(Tiny(a.seen_log), datamodule=data, ckpt_path=str(last) if a.resume else None)


if __name__ == "__main__":
    main()
