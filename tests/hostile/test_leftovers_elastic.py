"""Hostile elastic resumes: what the re-plan leaves out is counted. Saved by 2 ranks and
loaded by 3, the rest of the epoch (32 of 45 documents) does not divide by 3 and
``remainder="drop"`` leaves 2 out: they were in the old ranks' shares, never delivered, and
stats()["dropped_samples"] said 0. The ranks run one after another in this process (the
re-plan is a function of the state; no process group is needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import shardkit as sk
from shardkit import WebLoader

N = 45


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("elastic") / "set"
    with sk.ShardWriter(out, maxcount=10) as w:
        for i in range(N):
            w.write({"__key__": f"s{i:04d}", "txt": "x"})
    return str(out / "manifest.json")


def _loader(manifest: str, rank: int, world: int) -> WebLoader:
    ds = sk.ShardDataset(manifest, seed=3).split_by_node(rank, world).to_tuple("__key__")
    return WebLoader(ds.batched(2), num_workers=0)


def _run(
    manifest: str, world: int, state: dict[str, Any], stop: int | None
) -> tuple[list[str], int, dict[str, Any]]:
    """Every rank of a run of ``world`` from ``state``, each ``stop`` batches (None: to the
    end): the keys given, the dropped samples counted and the merged state."""
    keys: list[str] = []
    dropped = 0
    saved = []
    for rank in range(world):
        loader = _loader(manifest, rank, world)
        if state:
            loader.load_state_dict(state)
        for taken, batch in enumerate(loader, start=1):
            keys += list(batch[0])
            if taken == stop:
                break
        dropped += int(loader.stats()["dropped_samples"])
        saved.append(json.loads(json.dumps(loader.state_dict())))
    return keys, dropped, WebLoader.merge_states(saved) or {}


@pytest.mark.parametrize(
    "runs",
    [((2, 3), (3, None)), ((2, 1), (3, 1), (2, None)), ((2, 3), (3, 1), (2, None))],
)
def test_an_elastic_replan_counts_what_it_leaves_out(
    manifest: str, runs: tuple[tuple[int, int | None], ...]
) -> None:
    first = runs[0][0]
    share = N - N % first  # the first plan's remainder is no rank's share: never counted
    given: list[str] = []
    dropped = 0
    state: dict[str, Any] = {}
    for world, stop in runs:
        keys, lost, state = _run(manifest, world, state, stop)
        given += keys
        dropped += lost
    assert len(set(given)) == len(given)
    assert len(given) + dropped == share, f"{len(given)} given, {dropped} counted dropped"


def test_a_replan_that_divides_drops_nothing(manifest: str) -> None:
    given, _, state = _run(manifest, 2, {}, 2)  # 8 of 44 given: 36 left, 3 ranks take 12
    rest, dropped, _ = _run(manifest, 3, state, None)
    assert (len(given) + len(rest), dropped) == (44, 0)
