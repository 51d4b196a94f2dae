"""Per-source token exposure is what was delivered (issue 29, class 7): after best-fit or
greedy packing, ``stats()["sources"][name]["tokens"]`` equals the tokens of that source in
the batches handed out so far, and ``stats()["samples"]`` the documents begun in them,
after every batch, with 0 workers, worker processes and threads."""

from __future__ import annotations

import numpy as np
import pytest

import shardkit as sk

CODE = 100_000  # code ids are >= CODE, web ids below
START = 50_000  # a document's first id: its source's base + START + its number


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("exposure")
    out = {}
    for name, base, seed in (("web", 0, 1), ("code", CODE, 2)):
        rng = np.random.default_rng(seed)
        with sk.ShardWriter(root / name, maxcount=10, prefix=name) as w:
            for i, n in enumerate(rng.integers(1, 40, 40)):
                ids = base + np.concatenate([[START + i], rng.integers(0, 1000, int(n) - 1)])
                w.write({"__key__": f"{name}-{i:03d}", "tokens.npy": ids.astype(np.int32)})
        out[name] = str(root / name / "manifest.json")
    return out


@pytest.mark.parametrize(
    ("strategy", "workers", "mode"),
    [("best_fit", 0, "process"), ("greedy", 0, "process"), ("best_fit", 2, "process"),
     ("greedy", 2, "thread")],
)  # fmt: skip
def test_token_exposure_is_counted_at_delivery(
    sources: dict[str, str], strategy: str, workers: int, mode: str
) -> None:
    sets = {n: sk.ShardDataset(m, seed=3).decode() for n, m in sources.items()}
    ds = (
        sk.mix(sets, [1, 1], stop="longest", seed=5)
        .pack_tokens("tokens.npy", 16, strategy=strategy, buffer=12, pad=-1)
        .batched(2)
    )
    loader = sk.WebLoader(ds, num_workers=workers, worker_mode=mode)
    given = {"web": 0, "code": 0}
    begun = 0
    for batch in loader:
        tokens = np.asarray(batch)
        given["web"] += int(((tokens >= 0) & (tokens < CODE)).sum())
        given["code"] += int((tokens >= CODE).sum())
        begun += int(((tokens >= 0) & (tokens % CODE >= START)).sum())
        stats = loader.stats()
        assert {n: stats["sources"][n]["tokens"] for n in given} == given
        assert stats["samples"] == begun
    assert given["web"] > 0 and given["code"] > 0
