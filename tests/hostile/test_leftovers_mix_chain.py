"""Hostile elastic resumes of a mixture, two in a row (2 workers -> 3 -> 1, one process):
stats()["sources"] exposure is what was really delivered per source, whatever workers of
the middle run gave nothing after the first merge (their states hold the merged totals,
"shared": a merge or a stats read that summed them counted those totals again)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import shardkit as sk
from shardkit import WebLoader

SIZES = {"web": 30, "code": 18}


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixchain")
    for name, n in SIZES.items():
        with sk.ShardWriter(root / name, maxcount=7) as w:
            for i in range(n):
                w.write({"__key__": f"{name}-{i:03d}", "txt": "x"})
    return {name: str(root / name / "manifest.json") for name in SIZES}


def _loader(sets: dict[str, str], workers: int) -> WebLoader:
    srcs = {k: sk.ShardDataset(m, seed=5).shuffle(4) for k, m in sets.items()}
    ds = sk.mix(srcs, [2, 1], seed=1, stop="longest").to_tuple("__key__").batched(2)
    return WebLoader(ds, num_workers=workers, worker_mode="thread")


def _take(lo: WebLoader, stop: int | None) -> list[str]:
    keys: list[str] = []
    for taken, batch in enumerate(lo, start=1):
        keys += list(batch[0])
        if taken == stop:
            break
    return keys


@pytest.mark.parametrize(("first", "middle"), [(3, 1), (1, 2), (4, 5)])
def test_two_elastic_resumes_count_each_delivered_sample_once(
    sets: dict[str, str], first: int, middle: int
) -> None:
    given: list[str] = []
    dropped = 0
    state: dict[str, Any] = {}
    for workers, stop in ((2, first), (3, middle), (1, None)):
        lo = _loader(sets, workers)
        if state:
            lo.load_state_dict(state)
        given += _take(lo, stop)
        dropped += int(lo.stats()["dropped_samples"])  # each worker's last odd sample
        per_source = Counter(k.split("-")[0] for k in given)
        exposure = {n: lo.stats()["sources"][n]["samples"] for n in SIZES}
        assert exposure == {n: per_source[n] for n in SIZES}, f"after the {workers}-worker run"
        state = json.loads(json.dumps(lo.state_dict()))
        saved = state  # what the next run's stats start from: the same totals
        again = _loader(sets, 1 if workers != 1 else 2)
        again.load_state_dict(saved)
        loaded = {n: again.stats()["sources"][n]["samples"] for n in SIZES}
        assert loaded == exposure, f"the {workers}-worker run's state, loaded"
    assert len(set(given)) == len(given)
    assert len(given) + dropped == sum(SIZES.values())
