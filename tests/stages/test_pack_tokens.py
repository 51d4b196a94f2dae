"""pack_tokens strategies and boundaries: every token of every document once, boundaries
that match the documents, exact and elastic resume, best-fit cutting fewer documents."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit as sk
from shardkit import ShardDataset, WebLoader
from shardkit.errors import ConfigError
from tests.helpers.resumable import assert_resumable

LENGTHS = np.random.default_rng(5).integers(1, 150, size=90).tolist()
SEQ = 64


def doc_tokens(i: int, n: int) -> np.ndarray:
    """Document i: tokens unique across documents (i * 1000 + position)."""
    return (i * 1000 + np.arange(n)).astype(np.int32)


@pytest.fixture
def docs(tmp_path: Path) -> str:
    with sk.ShardWriter(tmp_path / "docs", maxcount=25) as w:
        for i, n in enumerate(LENGTHS):
            w.write({"__key__": f"doc-{i:04d}", "tokens.npy": doc_tokens(i, n)})
    return str(tmp_path / "docs" / "manifest.json")


def packed(manifest: str, **kw: Any) -> ShardDataset:
    return ShardDataset(manifest, seed=4).shuffle(10).decode().pack_tokens("tokens.npy", SEQ, **kw)


def check_sequence(seq: dict[str, Any], pad: int = -1) -> list[tuple[int, int, int]]:
    """The (document, first offset, length) runs of one sequence, checked against its
    position_ids and cu_seqlens; padding (``pad``) only in a last run of its own."""
    tokens, pos, cu = seq["tokens"], seq["position_ids"], seq["cu_seqlens"].tolist()
    assert tokens.shape == pos.shape == (SEQ,)
    assert cu[0] == 0 and cu[-1] == SEQ and cu == sorted(set(cu))
    runs = []
    for lo, hi in itertools.pairwise(cu):
        run = tokens[lo:hi]
        if run[0] == pad:
            assert hi == SEQ and np.all(run == pad) and pos[lo:hi].tolist() == list(range(hi - lo))
            continue
        doc, off = divmod(int(run[0]), 1000)
        assert run.tolist() == doc_tokens(doc, LENGTHS[doc])[off : off + hi - lo].tolist()
        assert pos[lo:hi].tolist() == list(range(off, off + hi - lo))
        runs.append((doc, off, hi - lo))
    return runs


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_every_token_once_and_boundaries_match_the_documents(docs: str, strategy: str) -> None:
    seqs = list(packed(docs, strategy=strategy, boundaries=True, pad=-1))
    runs = [r for s in seqs for r in check_sequence(s)]
    given = np.concatenate([doc_tokens(d, LENGTHS[d])[o : o + n] for d, o, n in runs])
    assert len(set(given.tolist())) == len(given)  # nothing twice
    everything = {t for i, n in enumerate(LENGTHS) for t in doc_tokens(i, n).tolist()}
    if strategy == "best_fit":
        assert set(given.tolist()) == everything  # every token of every document
        cut = {d for d, _, n in runs if n < LENGTHS[d]}
        assert all(LENGTHS[d] > SEQ for d in cut)  # only documents longer than a sequence
    else:
        assert len(everything) - len(given) < SEQ  # only the epoch's last partial sequence


def test_best_fit_cuts_fewer_documents_than_greedy(docs: str) -> None:
    def cut_and_fill(strategy: str) -> tuple[int, float]:
        seqs = list(packed(docs, strategy=strategy, boundaries=True, pad=-1))
        runs = [r for s in seqs for r in check_sequence(s)]
        pieces: dict[int, int] = {}
        for d, _, _ in runs:
            pieces[d] = pieces.get(d, 0) + 1
        cut = sum(1 for d, k in pieces.items() if k > -(-LENGTHS[d] // SEQ))
        return cut, sum(n for _, _, n in runs) / (len(seqs) * SEQ)

    greedy_cut, greedy_fill = cut_and_fill("greedy")
    best_cut, best_fill = cut_and_fill("best_fit")
    assert greedy_fill == 1.0 and best_cut == 0 < greedy_cut
    assert best_fill > 0.9  # the measured fill of this length mix is in scripts/bench


def test_batched_collates_flattened_cu_seqlens(docs: str) -> None:
    batch = next(iter(packed(docs, strategy="best_fit", boundaries=True).batched(3)))
    assert batch["tokens"].shape == batch["position_ids"].shape == (3, SEQ)
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == 3 * SEQ and np.all(np.diff(cu) > 0)
    assert {0, SEQ, 2 * SEQ} <= set(cu.tolist())  # every sequence starts a run
    assert batch["max_seqlen"] == int(np.diff(cu).max())


def test_bad_options_are_refused(docs: str) -> None:
    with pytest.raises(ConfigError, match="strategy"):
        packed(docs, strategy="first_fit")
    with pytest.raises(ConfigError, match="buffer"):
        packed(docs, strategy="best_fit", buffer=0)


PIPELINES: dict[str, Callable[[str], ShardDataset]] = {
    "best_fit": lambda m: packed(m, strategy="best_fit", buffer=7, eos=0),
    "best_fit-boundaries": lambda m: packed(m, strategy="best_fit", buffer=5, boundaries=True),
    "greedy-boundaries": lambda m: packed(m, boundaries=True, eos=0).batched(2),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_packing_resumes_exactly(docs: str, name: str) -> None:
    assert_resumable(lambda: PIPELINES[name](docs), rounds=4, prepare=lambda d: d.set_epoch(2))


def test_best_fit_elastic_resume_reads_nothing_twice(docs: str) -> None:
    """1 rank x 2 workers saved mid-group, resumed on 2 ranks x 1 worker: no token twice."""
    seen: list[int] = []

    def loader(rank: int, world: int, workers: int) -> WebLoader:
        ds = (
            ShardDataset(docs, seed=4)
            .split_by_node(rank, world)
            .shuffle(10)
            .decode()
            .pack_tokens("tokens.npy", SEQ, strategy="best_fit", buffer=6, boundaries=True, pad=-1)
            .batched(2)
        )
        ctx = "fork" if workers else None
        return WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)

    def tokens(batch: Any) -> list[int]:
        return [int(t) for t in np.asarray(batch["tokens"]).ravel() if t != -1]

    lo = loader(0, 1, 2)
    it = iter(lo)
    for _ in range(3):
        seen += tokens(next(it))
    state = json.loads(json.dumps(lo.state_dict()))
    del it
    for rank in range(2):
        again = loader(rank, 2, 0)
        again.load_state_dict(state)
        seen += [t for batch in again for t in tokens(batch)]
    assert len(seen) == len(set(seen))
    # left out: at most the rest of each old worker's group (6 documents of < 150 tokens)
    assert 0 < sum(LENGTHS) - len(seen) < 2 * 6 * 150
