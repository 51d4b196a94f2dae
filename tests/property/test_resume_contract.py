"""The resume contract over {pipelines} x {raise, warn, skip_shard over a damaged shard} x
{0, 2 workers} x {same world, other world}, stop points drawn by hypothesis.

Each rank of a 2-rank job (explicit ranks, no process group: each rank's loader runs to
its own end) stops at its own drawn step and saves its state; the states are joined with
``WebLoader.merge_states``. Same world: every rank's resumed tail is exactly what the
uninterrupted run yielded after its stop. Other world (3 ranks): nothing consumed is read
again and nothing is read twice.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import WebLoader
from tests.helpers.ddp import DOC_LENGTHS, NAMES, contract_pipeline, ident, make_data

OLD = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contract")
    make_data(root)
    return root


def _loader(root: Path, name: str, policy: str, rank: int, world: int, workers: int) -> WebLoader:
    ds = contract_pipeline(
        name, root, policy=policy, damaged=policy != "raise", rank=rank, world=world
    )
    ctx = "fork" if workers else None
    return WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)


def _items(batches: Any) -> list[list[str]]:
    return [ident(b) for b in batches]


@pytest.mark.parametrize("policy", ["raise", "warn", "skip_shard"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=3)
@given(workers=st.sampled_from([0, 2]), elastic=st.booleans(), data_st=st.data())
def test_resume_contract(
    data: Path, name: str, policy: str, workers: int, elastic: bool, data_st: st.DataObject
) -> None:
    full = [_items(_loader(data, name, policy, r, OLD, workers)) for r in range(OLD)]
    stops = [
        data_st.draw(st.integers(0, len(f)), label=f"stop rank {r}") for r, f in enumerate(full)
    ]
    states = []
    for rank, stop in enumerate(stops):
        loader = _loader(data, name, policy, rank, OLD, workers)
        it = iter(loader)
        head = [ident(next(it)) for _ in range(stop)]
        assert head == full[rank][:stop]
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    job = WebLoader.merge_states(states)
    if not elastic:
        for rank, stop in enumerate(stops):
            again = _loader(data, name, policy, rank, OLD, workers)
            again.load_state_dict(job)
            assert _items(again) == full[rank][stop:], f"rank {rank} resumed at {stop}"
        return
    consumed = [x for rank, stop in enumerate(stops) for b in full[rank][:stop] for x in b]
    after = []
    for rank in range(3):
        again = _loader(data, name, policy, rank, 3, 1 if workers else 0)
        again.load_state_dict(job)
        after += [x for b in _items(again) for x in b]
    if name == "pack":  # sequences of packed tokens: no token of a document used twice
        used = Counter(int(t) for seq in consumed + after for t in seq.split())
        assert all(used[i] <= n for i, n in enumerate(DOC_LENGTHS)), "a document read twice"
        return
    assert not set(consumed) & set(after), "consumed samples were read again"
    assert len(set(after)) == len(after), "a sample was read twice"
