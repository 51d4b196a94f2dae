"""Packing efficiency and the loader cost of boundaries and schedules (issue 21).

Part ``efficiency``: documents of a realistic length distribution (log-normal, median 600
tokens, sigma 1.0, at most 32,768) packed into 4,096-token sequences by

- shardkit ``greedy`` (the stream cut into sequences: no padding, documents cut),
- shardkit ``best_fit`` with buffers of 64, 256 and 1,024 documents (the same functions
  :class:`shardkit.stages.tokens.PackTokens` calls: ``pieces`` then ``best_fit`` per group),
- Grain's ``FirstFitPackIterDataset`` and ``BestFitPackIterDataset`` (a peer, from the bench
  venv; skipped with a note when grain is not installed),

reported as padding tokens per real token, documents cut per 1,000, tokens dropped per
1,000 real tokens, and packing time. Grain refuses a document longer than a sequence: it
gets the same pieces as shardkit's best_fit (documents cut into ``seq_len`` pieces), so the
rows compare the placement at equal input.

Part ``loader``: real shards of such documents read by ``ShardDataset`` in one process
(decode, pack, batched(8)), tokens/s of: the bare read+decode (the limit for this data),
greedy, greedy with boundaries, best-fit with boundaries, a mix of three sets with fixed
weights, and with a linear schedule in tokens. Medians of ``--repeats``, interleaved.

    python scripts/bench/packing.py --docs 50000 --repeats 5
    .bench-venv/bin/python scripts/bench/packing.py --parts efficiency   # with Grain
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench._common import environment, log, save_results, table
from shardkit.stages.packing import best_fit, pieces

SEQ_LEN = 4096


def lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(600), 1.0, size=n), 1, 32768).astype(np.int64)


# -- efficiency ----------------------------------------------------------------------
def greedy(lens: np.ndarray) -> dict[str, float]:
    """The stream cut every SEQ_LEN tokens (the last partial sequence dropped)."""
    ends = np.cumsum(lens)
    starts = ends - lens
    full = int(ends[-1] // SEQ_LEN) * SEQ_LEN
    # a document is cut when a sequence boundary falls strictly inside it
    cut = (starts // SEQ_LEN) != ((ends - 1) // SEQ_LEN)
    return {"padding": 0, "cut": int(cut.sum()), "dropped": int(ends[-1] - full)}


def shardkit_best_fit(lens: np.ndarray, buffer: int) -> dict[str, float]:
    padding = cut = 0
    for lo in range(0, len(lens), buffer):
        parts = [n for d in lens[lo : lo + buffer] for _, n in pieces(int(d), SEQ_LEN)]
        cut += sum(1 for d in lens[lo : lo + buffer] if d > SEQ_LEN)
        bins = best_fit(parts, SEQ_LEN)
        padding += len(bins) * SEQ_LEN - sum(parts)
    return {"padding": padding, "cut": cut, "dropped": 0}


def grain_packer(lens: np.ndarray, kind: str, bins: int) -> dict[str, float] | None:
    try:
        import grain
    except ImportError:
        return None
    # Grain takes documents no longer than a sequence: it gets the same pieces as best_fit
    parts = [m for d in lens for _, m in pieces(int(d), SEQ_LEN)]
    docs = [{"tokens": np.ones(m, dtype=np.int32)} for m in parts]
    ds = grain.MapDataset.source(docs).to_iter_dataset()
    cls = getattr(grain.experimental, f"{kind}FitPackIterDataset")
    packed = cls(ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins)
    padding = real = 0
    for seq in packed:
        seg = np.asarray(seq["tokens_segment_ids"])
        padding += int((seg == 0).sum())
        real += int((seg != 0).sum())
    cut = int((lens > SEQ_LEN).sum())
    return {"padding": padding, "cut": cut, "dropped": int(lens.sum()) - real}


def efficiency(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    lens = lengths(args.docs)
    real = int(lens.sum())
    contenders: list[tuple[str, Callable[[], dict[str, float] | None]]] = [
        ("shardkit greedy", lambda: greedy(lens)),
        *[
            (f"shardkit best_fit buffer={b}", lambda b=b: shardkit_best_fit(lens, b))
            for b in (64, 256, 1024)
        ],
        *[
            (f"grain {k}Fit bins={b}", lambda k=k, b=b: grain_packer(lens, k, b))
            for k in ("First", "Best")
            for b in (64, 256)
        ],
    ]
    rows, recs = [], []
    for name, fn in contenders:
        times, out = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            if out is None:
                break
        if out is None:
            rows.append([name, "not installed (bench venv: pip install grain)", "", "", ""])
            continue
        rec = {
            "name": name,
            "padding_per_real_token": out["padding"] / (real - out["dropped"]),
            "cut_per_1000_docs": out["cut"] / len(lens) * 1000,
            "dropped_per_1000_tokens": out["dropped"] / real * 1000,
            "median_s": statistics.median(times),
        }
        recs.append(rec)
        rows.append(
            [
                name,
                f"{rec['padding_per_real_token']:.4f}",
                f"{rec['cut_per_1000_docs']:.1f}",
                f"{rec['dropped_per_1000_tokens']:.2f}",
                f"{rec['median_s']:.2f}",
            ]
        )
    head = (
        f"{len(lens):,} documents, {real:,} tokens (log-normal, median "
        f"{int(np.median(lens))}, mean {lens.mean():.0f}), seq_len {SEQ_LEN}"
    )
    text = table(
        ["packer", "padding / real token", "cut / 1000 docs", "dropped / 1000 tokens", "s"], rows
    )
    return recs, head + "\n\n" + text


# -- loader --------------------------------------------------------------------------
def write_sets(work: Path, docs: int) -> dict[str, str]:
    import shardkit as sk

    out = {}
    for k, name in enumerate(("web", "code", "math")):
        manifest = work / f"packing-{docs}" / name / "manifest.json"
        if not manifest.exists():
            lens = lengths(docs // 3, seed=k + 1)
            rng = np.random.default_rng(k)
            with sk.ShardWriter(manifest.parent, prefix=name, maxsize="64MB") as w:
                for i, n in enumerate(lens):
                    tokens = rng.integers(1, 50_000, int(n), dtype=np.int32)
                    w.write({"__key__": f"{name}-{i:07d}", "tokens.npy": tokens})
        out[name] = str(manifest)
    return out


def pipelines(sets: dict[str, str]) -> list[tuple[str, Callable[[], Iterator[Any]]]]:
    import shardkit as sk

    def src(name: str) -> sk.ShardDataset:
        return sk.ShardDataset(sets[name], seed=1).decode()

    def one() -> sk.ShardDataset:
        return sk.mix([src(n) for n in sets], stop="longest", seed=0)

    anneal = sk.Schedule(
        [(0, {"web": 8, "code": 1, "math": 1}), (2_000_000, {"web": 2, "code": 4, "math": 4})],
        unit="tokens",
        interpolate="linear",
    )

    def pack(ds: sk.ShardDataset, **kw: Any) -> Iterator[Any]:
        return iter(ds.pack_tokens("tokens.npy", SEQ_LEN, **kw).batched(8))

    web = sets["web"]
    return [
        ("read+decode (limit)", lambda: iter(sk.ShardDataset(web, seed=1).decode())),
        ("read+decode 3 sets (limit)", lambda: itertools.chain(*(src(n) for n in sets))),
        ("greedy", lambda: pack(sk.ShardDataset(web, seed=1).decode())),
        ("greedy boundaries", lambda: pack(sk.ShardDataset(web, seed=1).decode(), boundaries=True)),
        (
            "best_fit boundaries",
            lambda: pack(
                sk.ShardDataset(web, seed=1).decode(), strategy="best_fit", boundaries=True
            ),
        ),
        ("mix fixed + greedy", lambda: pack(one())),
        (
            "mix schedule + best_fit boundaries",
            lambda: pack(
                sk.mix(
                    {n: src(n) for n in sets}, anneal, stop="longest", tokens_field="tokens.npy"
                ),
                strategy="best_fit",
                boundaries=True,
            ),
        ),
    ]


def count_tokens(item: Any) -> int:
    if isinstance(item, dict) and "tokens" in item:
        return int(np.asarray(item["tokens"]).size)
    if isinstance(item, dict):
        return int(np.asarray(item["tokens.npy"]).size)
    return int(np.asarray(item).size)


def loader(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    sets = write_sets(Path(args.work), args.loader_docs)
    runs = pipelines(sets)
    secs: dict[str, list[float]] = {name: [] for name, _ in runs}
    tokens: dict[str, int] = {}
    for rep in range(args.repeats):
        k = rep % len(runs)
        for name, make in runs[k:] + runs[:k]:
            t0 = time.perf_counter()
            tokens[name] = sum(count_tokens(x) for x in make())
            secs[name].append(time.perf_counter() - t0)
            log(f"  rep {rep + 1}/{args.repeats} {name:<36} {secs[name][-1]:7.2f} s")
    limits = {
        k: tokens[k] / statistics.median(secs[k])
        for k in ("read+decode (limit)", "read+decode 3 sets (limit)")
    }
    recs, rows = [], []
    for name, _ in runs:
        med = statistics.median(secs[name])
        rate = tokens[name] / med
        three = name.startswith("mix") or "3 sets" in name
        limit = limits["read+decode 3 sets (limit)" if three else "read+decode (limit)"]
        recs.append({"name": name, "median_s": med, "tokens": tokens[name], "tokens_per_s": rate})
        rows.append(
            [
                name,
                f"{med:.2f}",
                f"{tokens[name]:,}",
                f"{rate / 1e6:.1f}",
                f"{rate / limit * 100:.0f}%",
            ]
        )
    head = (
        f"one process, {args.loader_docs:,} documents in 3 sets (the one-set rows read 'web'; "
        "tokens out: a best-fit sequence's padding included)"
    )
    text = table(["pipeline", "median s", "tokens out", "M tokens/s", "of its read+decode"], rows)
    return recs, head + "\n\n" + text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=50_000, help="documents for the efficiency part")
    p.add_argument("--loader-docs", type=int, default=6_000, help="documents for the loader part")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parts", default="efficiency,loader")
    p.add_argument("--work", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, Any] = {}
    texts = []
    parts = {"efficiency": efficiency, "loader": loader}
    for part in args.parts.split(","):
        recs, text = parts[part](args)
        results[part] = recs
        texts.append(f"## {part}\n\n{text}\n")
    path = save_results(args.out, "packing", results)
    print("\n".join(texts))
    print(f"(medians of {args.repeats}; JSON: {path}; {environment()['loadavg_at_end']} load)")


if __name__ == "__main__":
    main()
