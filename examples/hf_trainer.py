"""A ShardDataset as transformers.Trainer's train_dataset, on CPU with 2 gloo processes.

    torchrun --nproc_per_node=2 examples/hf_trainer.py --data /tmp/sk-hf --run-dir /tmp/sk-hf-run

The Trainer hands the data set to accelerate, which splits it between ranks itself (rank 0
reads it and dispatches every step's batches), so the data set must *not* split by node:
give it whole, as here. ``--split-by-node`` shows the refusal you get otherwise;
``--no-dispatch`` runs accelerate's other mode (every rank reads the whole stream and keeps
its own batches). Stop it mid-epoch (``--stop-at 7``) and run it again with ``--resume``:
the Trainer resumes from its last checkpoint and skips the batches already trained.
``--seen-log`` records, per rank, the sample ids each training step saw.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

import shardkit as sk


def make_data(root: Path, n: int) -> None:
    """``n`` samples ``{"id": i}`` in uneven shards (a real data set is built once)."""
    if (root / "manifest.json").exists():
        return
    with sk.ShardWriter(root, maxcount=37) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:06d}", "json": {"id": i}})


def features(sample: dict[str, Any]) -> dict[str, int]:
    """What the model's forward takes (a module-level function: it pickles to workers)."""
    return {"ids": int(sample["json"]["id"])}


class Tiny(torch.nn.Module):
    """A one-weight model that writes down the ids of every batch it trains on."""

    def __init__(self, log: str | None) -> None:
        super().__init__()
        self.w = torch.nn.Linear(1, 1)
        self.log = log

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.log is not None:
            rank = int(os.environ.get("RANK", "0"))
            with open(f"{self.log}.{rank}", "a", encoding="utf-8") as f:
                f.write(json.dumps(ids.tolist()) + "\n")
        x = ids.float().unsqueeze(-1) / 1000
        return {"loss": ((self.w(x) - x) ** 2).mean()}


class StopAt(TrainerCallback):
    """Save and stop after step ``n`` (a crash mid-epoch, for the resume demo)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.n:
            control.should_save = True
            control.should_training_stop = True
        return control


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--split-by-node", action="store_true")
    p.add_argument("--no-dispatch", action="store_true")
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--seen-log", default=None)
    a = p.parse_args()
    if int(os.environ.get("RANK", "0")) == 0:
        make_data(a.data, a.samples)
    torch.distributed.init_process_group("gloo")  # the Trainer uses the group torchrun made
    torch.distributed.barrier()  # the data set exists before any rank reads it
    ds = sk.ShardDataset(str(a.data / "manifest.json"), seed=3)
    if a.split_by_node:
        ds = ds.split_by_node()  # refused by the Trainer's loader: see the module docstring
    ds = ds.shuffle(64).decode().map(features)
    args = TrainingArguments(
        output_dir=str(a.run_dir),
        per_device_train_batch_size=a.batch,
        num_train_epochs=a.epochs,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=a.stop_at or 10_000,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=a.workers,
        dataloader_drop_last=a.drop_last,
        remove_unused_columns=False,
        disable_tqdm=True,
        logging_strategy="no",
        accelerator_config={"dispatch_batches": not a.no_dispatch},
    )
    callbacks = [StopAt(a.stop_at)] if a.stop_at and not a.resume else []
    trainer = Trainer(
        model=Tiny(a.seen_log),
        args=args,
        train_dataset=ds,
        data_collator=default_data_collator,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    # gloo's threads end before the interpreter does, and before the model's DDP reducer lets
    # go of the group (a teardown that could otherwise hang: see end_process_group)
    sk.end_process_group()
    del trainer


if __name__ == "__main__":
    main()
