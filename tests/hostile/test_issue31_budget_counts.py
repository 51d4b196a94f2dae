"""Counts say what happened under batched(budget=) (issue 31): stats()['samples'] and a
mixture's per-source exposure equal what the batches handed out held, after every batch,
also after a restore in the middle of a group (a budget batching reads a group, and the
next one ahead, before it gives their items)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, StateDictError, WebLoader, mix
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, Manifest]:
    root = tmp_path_factory.mktemp("two")
    return lognormal_shards(root / "a", n=120, shards=2), lognormal_shards(
        root / "b", n=60, shards=2, seed=5
    )


def make(two: tuple[Manifest, Manifest], workers: int) -> WebLoader:
    sets = [ShardDataset(m, seed=3).shuffle(16).decode() for m in two]
    ds = mix(sets, weights=[1, 1], names=["a", "b"], tokens_field="tokens.npy")
    ds = ds.batched(budget=2000, cost="tokens.npy", buffer=40)
    return WebLoader(ds, num_workers=workers, multiprocessing_context="fork" if workers else None)


def counted(batches: list[Any]) -> dict[str, list[int]]:
    """Per source (its shard prefix's directory) samples and tokens in ``batches``."""
    out = {"a": [0, 0], "b": [0, 0]}
    for x in batches:
        for url, tokens in zip(x["__url__"], x["tokens.npy"], strict=True):
            got = out[Path(url).parent.name]
            got[0] += 1
            got[1] += int(tokens.numel())
    return out


def reported(ld: WebLoader) -> dict[str, list[int]]:
    s = ld.stats()["sources"]
    return {k: [s[k]["samples"], s[k]["tokens"]] for k in ("a", "b")}


@pytest.mark.parametrize("workers", [0, 2])
def test_exposure_and_samples_equal_the_batches_given(
    two: tuple[Manifest, Manifest], workers: int
) -> None:
    """Before: stats()['samples'] was 40 after a first batch of 5 samples (a group read),
    and each source's exposure stayed at the group's start (0 0 after batch 1 of 3)."""
    ld = make(two, workers)
    given: list[Any] = []
    for x in ld:
        given.append(x)
        assert reported(ld) == counted(given), len(given)
        assert ld.stats()["samples"] == sum(len(b["__key__"]) for b in given)
    assert len(given) > 8


def test_a_restore_in_a_group_counts_what_was_given(two: tuple[Manifest, Manifest]) -> None:
    ld = make(two, 0)
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(ld.state_dict()))
    assert json.loads(state["ranks"])[0]["workers"][0]["held"]  # mid-group
    again = make(two, 0)
    again.load_state_dict(state)
    assert reported(again) == counted(head)
    tail = []
    for x in again:
        tail.append(x)
        assert reported(again) == counted(head + tail)
        assert again.stats()["samples"] == sum(len(b["__key__"]) for b in tail)


def test_what_is_left_counts_the_held_groups_items_not_given(tmp_path: Path) -> None:
    """What a worker has still to give (the shared epoch end's dropped_samples) after
    every batch: the rest of the group it holds was counted as given (on 2 gloo ranks x 2
    workers a rank cut short reported 192 delivered, 0 dropped, of 200)."""
    m = lognormal_shards(tmp_path / "d", n=100, shards=2)
    ds = ShardDataset(m, seed=3).shuffle(16).decode()
    ds = ds.batched(budget=2000, cost="tokens.npy", buffer=40)
    ctx, tail = ds.context(), ds.pipeline()
    cursor = tail.iterate(ctx)
    given, held = 0, 0
    for batch in cursor:
        given += len(batch["__key__"])
        state = json.loads(json.dumps(cursor.state()))
        held += bool(state.get("held"))
        assert tail.left(ctx, state) == 100 - given
    assert held > 3


SQUARED = {"on": False}


def doc_cost(sample: dict[str, Any]) -> float:
    """A cost whose body a user changes between runs, keeping its name."""
    n = int(sample["tokens.npy"].size)
    return float(n * n) / 300 if SQUARED["on"] else float(n)


@pytest.mark.parametrize(
    "edit",
    ["cost", "skip", "skip0", "done"],
)
def test_a_restore_whose_group_packs_otherwise_is_refused(tmp_path: Path, edit: str) -> None:
    """The group is read again and the batches given are skipped by count: with another
    cost under the same name (or a hand-edited skip or mask) batches were given twice or
    never, with no error."""
    m = lognormal_shards(tmp_path / "d", n=100, shards=2)

    def make() -> WebLoader:
        ds = ShardDataset(m, seed=3).shuffle(16).decode()
        return WebLoader(ds.batched(budget=2000, cost=doc_cost, buffer=40))

    ld = make()
    it = iter(ld)
    head = [k for _ in range(2) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(ld.state_dict()))
    ranks = json.loads(state["ranks"])
    saved = ranks[0]["workers"][0]
    assert saved["held"]
    if edit == "skip":
        saved["skip"] = 999
    elif edit == "skip0":
        saved["skip"] = 0
    elif edit == "done":
        saved["done"] = "f" * 10
    state["ranks"] = json.dumps(ranks)
    SQUARED["on"] = edit == "cost"
    try:
        again = make()
        again.load_state_dict(state)
        with pytest.raises(StateDictError, match=r"budget_batched: the group .* read again"):
            tail = [k for x in again for k in x["__key__"]]
            assert sorted(head + tail) == sorted({*head, *tail}) and len(head + tail) == 100
    finally:
        SQUARED["on"] = False


def test_counts_after_a_batch_size_change_from_a_held_group(
    two: tuple[Manifest, Manifest],
) -> None:
    """budget -> batched(4) mid-group (the group replayed): stats()['samples'] counted the
    group's items given before the change again (132 for 116 delivered), and the replay's
    state carried the mixture's counts of the group's end (its copy of the state it began
    from was changed under it), so each source's exposure ran ahead; also after a save and
    load of the replay's state."""
    head_ld = make(two, 0)
    it = iter(head_ld)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(head_ld.state_dict()))

    def plain() -> WebLoader:
        sets = [ShardDataset(m, seed=3).shuffle(16).decode() for m in two]
        return WebLoader(
            mix(sets, weights=[1, 1], names=["a", "b"], tokens_field="tokens.npy").batched(4)
        )

    ramp = plain()
    ramp.load_state_dict(state, allow={"batch_size"})
    it = iter(ramp)
    mid = [next(it) for _ in range(2)]
    assert reported(ramp) == counted(head + mid)
    assert ramp.stats()["samples"] == sum(len(b["__key__"]) for b in mid)
    again = plain()
    again.load_state_dict(json.loads(json.dumps(ramp.state_dict())))
    assert reported(again) == counted(head + mid)
    tail = []
    for x in again:
        tail.append(x)
        assert reported(again) == counted(head + mid + tail)
    assert again.stats()["samples"] == sum(len(b["__key__"]) for b in tail)
