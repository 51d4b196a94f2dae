"""What the DDP contract costs: the shared epoch end and the job's resume state.

Three measurements, each a median of ``--repeats`` runs, interleaved:

1. ``collective``: the bare per-step all_reduce of three int64 on a gloo group of
   ``--ranks`` spawned processes (127.0.0.1): what the shared epoch end adds per batch.
2. ``loader``: one epoch through ``WebLoader`` (small profile, ``--workers`` workers per
   rank, batches of ``--batch``) on every rank, with ``sync=True`` (a collective every
   batch), ``sync=None`` (the default: this plain pipeline is in step by construction, so
   no collective) and ``sync=False``; samples/s per rank, ratios, the per-step difference;
   ``--step-ms`` adds a simulated training step per batch, which the vote overlaps.
3. ``state_dict``: the time of ``loader.state_dict()`` with 8 workers mid-epoch, one process
   (no group) and under the process group (it gathers every rank's cursors).

    .venv/bin/python scripts/bench/ddp.py --size 200MB --repeats 5
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import base_parser, finish, fmt, log, make_dataset, parse_common, table

import shardkit as sk


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loader(manifest: str, workers: int, batch: int, sync: bool | None) -> sk.WebLoader:
    ds = sk.ShardDataset(manifest, seed=1).split_by_node().shuffle(1000).batched(batch)
    ctx = "fork" if workers else None
    return sk.WebLoader(ds, num_workers=workers, multiprocessing_context=ctx, sync=sync)


def _rank(rank: int, world: int, port: int, spec: dict[str, Any], out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    res: dict[str, Any] = {"collective_us": [], "steps": [], "state_ms": []}
    modes: list[tuple[str, bool | None]] = [("on", True), ("auto", None), ("off", False)]
    for name, _ in modes:
        res[name] = []
    try:
        t = torch.zeros(3, dtype=torch.int64)
        for _ in range(spec["repeats"]):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(spec["calls"]):
                dist.all_reduce(t)
            res["collective_us"].append((time.perf_counter() - t0) / spec["calls"] * 1e6)
            for mode in modes[_ % 3 :] + modes[: _ % 3]:
                loader = _loader(spec["manifest"], spec["workers"], spec["batch"], mode[1])
                dist.barrier()
                t0 = time.perf_counter()
                steps = 0
                for _b in loader:
                    steps += 1
                    if spec["step_s"]:
                        time.sleep(spec["step_s"])  # the training step the vote overlaps
                res[mode[0]].append(time.perf_counter() - t0)
                res["steps"].append(steps)
            loader = _loader(spec["manifest"], 8, spec["batch"], None)
            it = iter(loader)
            for _i in range(20):
                next(it)
            dist.barrier()
            t0 = time.perf_counter()
            for _i in range(20):
                loader.state_dict()
            res["state_ms"].append((time.perf_counter() - t0) / 20 * 1e3)
            del it
        with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def _state_alone(manifest: str, batch: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        loader = _loader(manifest, 8, batch, False)
        it = iter(loader)
        for _i in range(20):
            next(it)
        t0 = time.perf_counter()
        for _i in range(20):
            loader.state_dict()
        out.append((time.perf_counter() - t0) / 20 * 1e3)
        del it
    return out


def main() -> None:
    p = base_parser(__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="loader workers per rank")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--calls", type=int, default=2000, help="bare all_reduce calls per repeat")
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated training step")
    p.set_defaults(size="100MB", profiles="small")
    args = p.parse_args()
    parse_common(args)
    data = make_dataset("small", args.size_bytes)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        with sk.ShardWriter(tmp, maxsize=args.shard_bytes) as w:
            for s in data.samples:
                w.write(s)
        manifest = os.path.join(tmp, "manifest.json")
        spec = {
            "manifest": manifest,
            "workers": args.workers,
            "batch": args.batch,
            "repeats": args.repeats,
            "calls": args.calls,
            "step_s": args.step_ms / 1e3,
        }
        log(f"{args.ranks} gloo ranks x {args.workers} workers, {len(data.samples):,} samples")
        mp.spawn(_rank, args=(args.ranks, _port(), spec, tmp), nprocs=args.ranks, join=True)
        ranks = []
        for r in range(args.ranks):
            with open(os.path.join(tmp, f"rank{r}.json"), encoding="utf-8") as f:
                ranks.append(json.load(f))
        alone = _state_alone(manifest, args.batch, args.repeats)

    def med(key: str) -> float:
        return statistics.median(x for r in ranks for x in r[key])

    steps = ranks[0]["steps"][0]
    per_rank = len(data.samples) // args.ranks
    on, auto, off = med("on"), med("auto"), med("off")
    rows = [
        ["all_reduce of 3 int64 (bare)", fmt(med("collective_us"), ".1f") + " us/step", "", ""],
        ["epoch, sync=True", fmt(on, ".2f") + " s", fmt(per_rank / on), fmt(off / on, ".3f")],
        ["epoch, sync=None", fmt(auto, ".2f") + " s", fmt(per_rank / auto), fmt(off / auto, ".3f")],
        ["epoch, sync=False", fmt(off, ".2f") + " s", fmt(per_rank / off), "1.000"],
        ["per-step difference", fmt((on - off) / steps * 1e6, ".0f") + " us", "", ""],
        ["state_dict(), 8 workers, no group", fmt(statistics.median(alone), ".3f") + " ms", "", ""],
        [
            f"state_dict(), 8 workers, {args.ranks} ranks",
            fmt(med("state_ms"), ".3f") + " ms",
            "",
            "",
        ],
    ]
    text = table(["measure", "median", "samples/s/rank", "off/this"], rows)
    results = {"ranks": ranks, "state_alone_ms": alone, "steps": steps, "per_rank": per_rank}
    finish(args.out, "ddp", results, [text], f"medians of {args.repeats}; {steps} steps")


if __name__ == "__main__":
    main()
