"""A pretraining mixture on CPU: three sources, an annealing schedule, endless per-source
epochs, best-fit packing with document boundaries, exposure per source, a checkpoint that
changes the weights.

Run it (a few seconds; data made on first use under ``--data``)::

    python examples/mixtures.py --data /tmp/sk-mix

What it does:

1. ``web``, ``code`` and ``math`` documents (token arrays of log-normal length) as shards.
2. ``sk.mix`` by name with an ``sk.Schedule``: mostly web during warm-up, then annealing
   onto code and math (linear between the points), in tokens drawn by the whole job.
   ``stop="never"``: a source that runs out starts its own next epoch (its own reshuffle).
3. ``pack_tokens(strategy="best_fit", boundaries=True)``: whole documents placed into the
   fullest sequence they fit, with ``position_ids`` and ``cu_seqlens`` for varlen attention.
4. ``with_epoch`` makes nominal epochs of a fixed number of batches.
5. Prints ``loader.stats()["sources"]`` after each epoch; saves the loader state, then
   resumes it with new weights (``reweight=True``): every source keeps its cursor and epoch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

import shardkit as sk

SEQ_LEN = 256
SOURCES = {"web": (400, 0), "code": (120, 1), "math": (60, 2)}  # documents, seed


def make_data(root: Path) -> dict[str, str]:
    """One shard set per source (skipped when present): documents of log-normal length."""
    out = {}
    for name, (docs, seed) in SOURCES.items():
        manifest = root / name / "manifest.json"
        if not manifest.exists():
            rng = np.random.default_rng(seed)
            with sk.ShardWriter(root / name, prefix=name, maxcount=100) as w:
                for i in range(docs):
                    n = int(np.clip(rng.lognormal(np.log(60), 0.8), 1, 1000))
                    w.write({"__key__": f"{name}-{i:05d}", "tokens.npy": rng.integers(1, 500, n)})
        out[name] = str(manifest)
    return out


def pipeline(data: dict[str, str], weights: Any) -> sk.ShardDataset:
    sources = {name: sk.ShardDataset(m, seed=7).shuffle(64).decode() for name, m in data.items()}
    return (
        sk.mix(sources, weights, seed=1, stop="never")
        .pack_tokens("tokens.npy", SEQ_LEN, eos=0, strategy="best_fit", boundaries=True, pad=0)
        .batched(8)
        .with_epoch(20)
    )


def show(title: str, loader: sk.WebLoader) -> None:
    print(title)
    for name, row in loader.stats()["sources"].items():
        print(
            f"  {name:5} samples {row['samples']:5}  tokens {row['tokens']:7}  epochs "
            f"{row['epochs']}  share {row['share']:.2f}  weight now {row['weight']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/sk-mix"))
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    data = make_data(args.data)
    anneal = sk.Schedule(
        [(0, {"web": 8, "code": 1, "math": 1}), (60_000, {"web": 2, "code": 4, "math": 4})],
        unit="tokens",
        interpolate="linear",
    )
    loader = sk.WebLoader(pipeline(data, anneal), num_workers=args.workers)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch["cu_seqlens"][-1] == batch["tokens"].numel()
        show(f"after epoch {epoch} ({len(loader)} batches of 8 x {SEQ_LEN} tokens):", loader)
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint would hold it

    # an evaluation says: more math. Same sources, new weights, from the saved progress.
    more_math = {"web": 1, "code": 1, "math": 8}
    resumed = sk.WebLoader(pipeline(data, more_math), num_workers=args.workers)
    resumed.load_state_dict(state, reweight=True)
    resumed.set_epoch(2)
    for _ in resumed:
        pass
    show("after epoch 2, reweighted to more math:", resumed)


if __name__ == "__main__":
    main()
