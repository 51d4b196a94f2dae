"""Steps of equal cost across ranks: budget batches against plain ones (issue 31).

Data: real shards of documents whose token counts are log-normal (median 300, sigma 1.0,
at most 32,768), int32 tokens.

Part ``balance``: two ranks' pipelines (``split_by_node(r, 2)``, ``shuffle(1000)``, read one
after the other in this process) and their per-step costs: for each step, the ratio of the
costliest rank's cost to the ranks' mean (max/mean: 1.0 is a perfect balance; the slowest
rank sets the step time), its median and 90th percentile, and the share of steps whose two
costs are within 10% (max <= 1.1 min). Rows:

- ``batched(24)``: plain batches of 24 documents, cost in tokens and in attention (the sum
  of squared document lengths);
- ``batched(budget=B, cost="tokens.npy")``: ``B`` = 24 mean documents' tokens;
- ``batched(budget=B2, cost=squares)``: ``B2`` = 24 mean documents' squared lengths (each
  document's cost its length squared), with the default buffer (1,024) and with 4,096;
- ``pack_tokens(2048, boundaries=True)`` then ``batched(8)``, attention cost from
  ``cu_seqlens``, against ``batched(budget=8 mean sequences, cost=attention_cost)``.

The steps are those both ranks have (the loader's shared epoch end stops there).

Part ``rate``: a WebLoader's epoch over one rank's share, in fresh worker processes
(``--workers``, default 2, then 0: in this process), plain ``batched(24)`` against the token
budget: samples/s, and samples per CPU second of this process and its workers (steadier
than the wall time on a shared machine); medians of ``--repeats``, the two pipelines
interleaved, and the median of each repeat's ratio budget/plain (the pair ran back to back,
under about the same load). The load average before and after is in the JSON and the note.

    python scripts/bench/budget.py --docs 40000 --repeats 5 --parts rate --workers 2,0
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench._common import finish, fresh_dir, log, table
from shardkit import ShardDataset, WebLoader
from shardkit.stages.costs import attention_cost
from shardkit.write.writer import ShardWriter

SEQ_LEN = 2048


def make_docs(root: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` log-normal documents in shards of 5,000; their lengths."""
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(np.log(300), 1.0, n), 1, 32768).astype(np.int64)
    with ShardWriter(fresh_dir(root), prefix="docs", maxsize="2GB") as w:
        for i, k in enumerate(lens):
            w.write({"__key__": f"doc-{i:08d}", "tokens.npy": rng.integers(0, 50_000, k, np.int32)})
            if (i + 1) % 5000 == 0:
                w.next_shard()
    return lens


def squares(sample: dict[str, Any]) -> float:
    """A document's attention cost: its length squared."""
    n = sample["tokens.npy"].size
    return float(n * n)


def base(root: str, rank: int = 0, world: int = 2) -> ShardDataset:
    return (
        ShardDataset(Path(root, "manifest.json"), seed=7)
        .split_by_node(rank, world)
        .shuffle(1000)
        .decode()
    )


def tokens(batch: Any) -> float:
    return float(sum(len(t) for t in batch["tokens.npy"]))


def attention(batch: Any) -> float:
    if "cu_seqlens" in batch:
        runs = np.diff(np.asarray(batch["cu_seqlens"]))
        return float(np.dot(runs, runs))
    return float(sum(len(t) ** 2 for t in batch["tokens.npy"]))


def balance(per_rank: list[list[float]]) -> dict[str, float]:
    steps = np.array(list(zip(*per_rank, strict=False)), dtype=float)
    ratio = steps.max(axis=1) / steps.mean(axis=1)
    within = steps.max(axis=1) <= 1.1 * steps.min(axis=1)
    return {
        "steps": len(steps),
        "ratio_median": float(np.median(ratio)),
        "ratio_p90": float(np.percentile(ratio, 90)),
        "within_10pct": float(within.mean()),
    }


def part_balance(root: str, lens: np.ndarray) -> list[dict[str, Any]]:
    mean_tokens = float(lens.mean())
    mean_squares = float((lens.astype(float) ** 2).mean())
    b_tokens, b_squares = 24 * mean_tokens, 24 * mean_squares
    seq_cost = []  # the mean attention cost of a packed sequence, measured on rank 0
    for i, seq in enumerate(base(root, 0).pack_tokens("tokens.npy", SEQ_LEN, boundaries=True)):
        seq_cost.append(attention_cost(seq))
        if i == 2000:
            break
    b_packed = 8 * float(np.mean(seq_cost))
    pipelines: list[tuple[str, Callable[[int], Iterable[Any]], list[tuple[str, Any]]]] = [
        (
            "batched(24)",
            lambda r: base(root, r).batched(24),
            [("tokens", tokens), ("attention", attention)],
        ),
        (
            f"batched(budget={b_tokens:.0f}, cost='tokens.npy')",
            lambda r: base(root, r).batched(budget=b_tokens, cost="tokens.npy"),
            [("tokens", tokens)],
        ),
        (
            f"batched(budget={b_squares:.3g}, cost=squares)",
            lambda r: base(root, r).batched(budget=b_squares, cost=squares),
            [("attention", attention)],
        ),
        (
            f"batched(budget={b_squares:.3g}, cost=squares, buffer=4096)",
            lambda r: base(root, r).batched(budget=b_squares, cost=squares, buffer=4096),
            [("attention", attention)],
        ),
        (
            f"pack_tokens({SEQ_LEN}, boundaries) + batched(8)",
            lambda r: base(root, r).pack_tokens("tokens.npy", SEQ_LEN, boundaries=True).batched(8),
            [("attention", attention)],
        ),
        (
            f"pack_tokens({SEQ_LEN}, boundaries) + batched(budget={b_packed:.3g}, attention_cost)",
            lambda r: (
                base(root, r)
                .pack_tokens("tokens.npy", SEQ_LEN, boundaries=True)
                .batched(budget=b_packed, cost=attention_cost, buffer=128)
            ),
            [("attention", attention)],
        ),
    ]
    rows = []
    for name, make, costs in pipelines:
        batches = [list(make(r)) for r in (0, 1)]
        for cost_name, cost in costs:
            per_rank = [[cost(b) for b in bs] for bs in batches]
            row = {"pipeline": name, "cost": cost_name, **balance(per_rank)}
            log(f"{name} [{cost_name}]: {row}")
            rows.append(row)
    return rows


def samples_of(batch: Any) -> int:
    return len(batch["__key__"])


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that ended (the workers, once a
    loader without kept workers has stopped them)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def part_rate(root: str, repeats: int, b_tokens: float, modes: list[int]) -> list[dict[str, Any]]:
    """Samples/s of one rank's share (of 2), an epoch in fresh workers (``modes``: worker
    counts, 0: in this process), and samples per CPU second (this process and its workers:
    on a shared machine the CPU time varies less with the others' load than the wall
    time), medians of ``repeats``, and the median of each repeat's ratio budget/plain."""
    makers = {
        "batched(24)": lambda: base(root, 0).batched(24),
        "batched(budget)": lambda: base(root, 0).batched(budget=b_tokens, cost="tokens.npy"),
    }
    rows = []
    for workers in modes:
        walls: dict[str, list[float]] = {k: [] for k in makers}
        cpus: dict[str, list[float]] = {k: [] for k in makers}
        counts: dict[str, int] = {}
        batches: dict[str, int] = {}
        for _ in range(repeats):
            for name, make in makers.items():
                loader = WebLoader(make(), num_workers=workers, persistent_workers=False)
                t, c = time.perf_counter(), cpu_seconds()
                sizes = [samples_of(b) for b in loader]
                counts[name], batches[name] = sum(sizes), len(sizes)
                walls[name].append(time.perf_counter() - t)
                cpus[name].append(cpu_seconds() - c)
        plain, budget = (walls[name] for name in makers)
        ratios = [p / b for p, b in zip(plain, budget, strict=True)]  # rate budget / plain
        for name in makers:
            rate = counts[name] / statistics.median(walls[name])
            per_cpu = counts[name] / statistics.median(cpus[name])
            rates = [counts[name] / w for w in walls[name]]
            row = {"pipeline": name, "workers": workers, "samples_per_s": rate}
            row.update(per_cpu_s=per_cpu, min_per_s=min(rates), max_per_s=max(rates))
            row["per_batch"] = counts[name] / batches[name]
            if name == "batched(budget)":
                row["ratio_median"] = statistics.median(ratios)
            rows.append(row)
            log(f"rate {name} workers={workers}: {rate:,.0f}/s, {per_cpu:,.0f} per CPU s")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=40_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parts", default="balance,rate")
    p.add_argument("--workers", default="2,0", help="the rate part's worker counts")
    p.add_argument("--work", default="bench-out/budget")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    lens = make_docs(args.work, args.docs)
    results: dict[str, Any] = {"docs": args.docs, "mean_tokens": float(lens.mean())}
    texts = []
    if "balance" in args.parts:
        rows = part_balance(args.work, lens)
        results["balance"] = rows
        texts.append(
            table(
                ["pipeline", "cost", "steps", "max/mean median", "p90", "within 10%"],
                [
                    [
                        r["pipeline"],
                        r["cost"],
                        str(r["steps"]),
                        f"{r['ratio_median']:.3f}",
                        f"{r['ratio_p90']:.3f}",
                        f"{100 * r['within_10pct']:.0f}%",
                    ]
                    for r in rows
                ],
            )
        )
    if "rate" in args.parts:
        modes = [int(w) for w in args.workers.split(",")]
        load = os.getloadavg()[0]
        rows = part_rate(args.work, args.repeats, 24 * float(lens.mean()), modes)
        results["rate"] = rows
        results["load_average"] = [load, os.getloadavg()[0]]
        texts.append(
            table(
                [
                    "pipeline",
                    "workers",
                    "samples/s",
                    "min..max",
                    "budget/plain",
                    "per CPU s",
                    "per batch",
                ],
                [
                    [
                        r["pipeline"],
                        str(r["workers"]),
                        f"{r['samples_per_s']:,.0f}",
                        f"{r['min_per_s']:,.0f}..{r['max_per_s']:,.0f}",
                        f"{r['ratio_median']:.3f}" if "ratio_median" in r else "",
                        f"{r['per_cpu_s']:,.0f}",
                        f"{r['per_batch']:.1f}",
                    ]
                    for r in rows
                ],
            )
        )
    note = "per-step cost balance and rate (issue 31)"
    if "load_average" in results:
        a, b = results["load_average"]
        note += f"; load average {a:.1f} -> {b:.1f} on {os.cpu_count()} CPUs"
    finish(args.out, "budget", results, texts, note)


if __name__ == "__main__":
    main()
