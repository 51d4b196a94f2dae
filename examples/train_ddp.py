"""Train a tiny next-token model with DDP on CPU, streaming shards, resumable mid-epoch.

Run on one machine with two processes (gloo backend, CPU only)::

    torchrun --nproc_per_node=2 examples/train_ddp.py --data /tmp/sk-train --ckpt /tmp/sk-ckpt.pt

Stop it at any time (or pass ``--stop-after 5`` to stop after step 5) and run the same
command again: it loads the checkpoint - model, optimizer and every rank's data state -
and goes on with exactly the batches the uninterrupted run would have trained on.

The data set (made on first use with :class:`shardkit.ShardWriter`) holds documents of
random length; ``pack_tokens`` cuts them into fixed-length training sequences. Ranks hold
the same number of documents, not tokens, so they would run out at different steps: the
loader ends the epoch on every rank when the first runs out (no hand-written all_reduce).
Every rank calls ``loader.state_dict()`` at the same step (it gathers every rank's
cursors); rank 0 saves it; every rank of the next run loads it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import shardkit as sk

VOCAB = 97
SEQ = 33  # 32 inputs and their 32 next tokens


def make_data(out: Path, docs: int = 600) -> None:
    """A small synthetic token data set: documents of 20-120 tokens with a learnable rule."""
    rng = np.random.default_rng(0)
    with sk.ShardWriter(out, maxcount=90, maxsize="4MB") as w:
        for i in range(docs):
            start = int(rng.integers(VOCAB))
            n = int(rng.integers(20, 120))
            tokens = (start + 3 * np.arange(n)) % VOCAB  # the next token is +3: learnable
            w.write({"__key__": f"doc-{i:06d}", "tokens.npy": tokens.astype(np.int16)})


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(x)))  # type: ignore[no-any-return]


def to_int64(seq: np.ndarray) -> np.ndarray:
    return seq.astype(np.int64)  # embedding indices (a named function pickles to workers)


def loader_for(data: Path, workers: int) -> sk.WebLoader:
    ds = (
        sk.ShardDataset(str(data / "manifest.json"), seed=1234)
        .split_by_node()
        .shuffle(64)
        .decode()
        .pack_tokens("tokens.npy", SEQ)
        .map(to_int64)
        .batched(8)
    )
    ctx = "fork" if workers else None
    return sk.WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)


def save(
    path: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loader: sk.WebLoader,
    epoch: int,
    step: int,
) -> None:
    """Rank 0 writes model, optimizer and the job's data state, atomically."""
    data = loader.state_dict()  # on every rank: it gathers every rank's cursors
    if dist.get_rank() == 0:
        ckpt = {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "epoch": epoch,
            "step": step,
            "data": data,
        }
        tmp = path.with_suffix(".tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, path)
    dist.barrier()


def digest(batch: torch.Tensor) -> str:
    return hashlib.sha1(batch.numpy().tobytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("/tmp/shardkit-train-data"))
    p.add_argument("--ckpt", type=Path, default=Path("/tmp/shardkit-train-ckpt.pt"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--docs", type=int, default=600, help="documents in a new data set")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--save-every", type=int, default=4, help="steps between checkpoints")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this step")
    p.add_argument("--step-log", type=Path, default=None, help="append one JSON line per step")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    if rank == 0 and not (args.data / "manifest.json").exists():
        make_data(args.data, args.docs)
    dist.barrier()

    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = loader_for(args.data, args.workers)
    start_epoch, step = 0, 0
    if args.ckpt.exists():
        ckpt = torch.load(args.ckpt, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["data"])  # the same state on every rank
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        if rank == 0:
            print(f"resumed at epoch {start_epoch}, step {step}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:  # the same number of batches on every rank
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if args.step_log is not None:
                with open(args.step_log, "a", encoding="utf-8") as f:
                    line = {
                        "rank": rank,
                        "epoch": epoch,
                        "step": step,
                        "batch": digest(batch),
                        "loss": round(loss.item(), 6),
                    }
                    f.write(json.dumps(line) + "\n")
            if step % args.save_every == 0 or step == args.stop_after:
                save(args.ckpt, model, opt, loader, epoch, step)
            if step == args.stop_after:
                sk.end_process_group()
                return
        save(args.ckpt, model, opt, loader, epoch + 1, step)  # the epoch is done
        if rank == 0:
            rate = loader.stats()["samples_per_s"]
            print(f"epoch {epoch} done at step {step}: {rate:.0f} sequences/s", flush=True)
    sk.end_process_group()  # barrier, gloo's thread settles, then destroy (a clean exit)


if __name__ == "__main__":
    main()
