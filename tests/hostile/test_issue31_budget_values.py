"""Hostile values for batched(budget=B, cost=...) and batched(n) (issue 31): every cost a
batch is filled by is a finite number >= 0 measured in elements, every budget a finite
number > 0, every batch size an integer; an item that is None is an item, not the end."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset
from shardkit.errors import ConfigError, DecodeError
from shardkit.format.manifest.model import Manifest
from shardkit.write.writer import ShardWriter


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """40 documents of 1..40 tokens in 2 shards."""
    root = tmp_path_factory.mktemp("docs")
    with ShardWriter(root, prefix="docs", maxsize="2GB") as w:
        for i in range(40):
            w.write({"__key__": f"doc-{i:03d}", "tokens.npy": np.full(i + 1, i, np.int32)})
            if i == 19:
                w.next_shard()
    return Manifest.load(os.path.join(root, "manifest.json"))


def base(m: Manifest) -> ShardDataset:
    return ShardDataset(m, seed=1).decode()


def test_a_none_item_is_an_item_not_the_end_of_the_stream(docs: Manifest) -> None:
    """A map giving None for some samples: plain batched hands every item on; the budget
    batching took None for its upstream's end (dropped it, and two in a row ended the
    epoch: 32 of 40 items, no error)."""
    gone = {"doc-005", "doc-006", "doc-007", "doc-025"}

    def blank(s: dict[str, Any]) -> dict[str, Any] | None:
        return None if s["__key__"] in gone else s

    def one(item: Any) -> float:
        return 1.0

    plain = [x for b in base(docs).map(blank).batched(4, collate=list) for x in b]
    ds = base(docs).map(blank).batched(budget=4, cost=one, collate=list)
    got = [x for b in ds for x in b]
    assert len(plain) == 40
    assert len(got) == 40
    assert sorted(x["__key__"] for x in got if x is not None) == sorted(
        x["__key__"] for x in plain if x is not None
    )


def test_a_field_cost_counts_a_tensors_elements(docs: Manifest) -> None:
    """cost=field counts elements: a 3x50 tensor costs 150 (its len() is 3: 40 of them,
    6000 elements, went into one batch of budget 160)."""

    def tensor(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "t": torch.ones(3, 50)}

    sizes = [len(b) for b in base(docs).map(tensor).batched(budget=160, cost="t", collate=list)]
    assert sizes == [1] * 40


@pytest.mark.parametrize("value", [7, 2.5, None])
def test_a_field_without_elements_is_refused_naming_it(docs: Manifest, value: Any) -> None:
    def field(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "n": value}

    with pytest.raises(DecodeError, match=r"cost='n'.*(int|float|NoneType)"):
        list(base(docs).map(field).batched(budget=10, cost="n"))


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), -5.0, -1, None, "12", True, [1.0], np.array([3.0])]
)
def test_a_cost_that_is_not_a_finite_number_at_least_0_is_refused(docs: Manifest, bad: Any) -> None:
    """NaN: ZeroDivisionError; -5: all 40 items in one batch; None, a list: a bare
    TypeError; '12' and True: read as 12 and 1, with no error."""

    def cost(item: Any) -> Any:
        return bad

    with pytest.raises(DecodeError, match=r"sample 'doc-\d+'.*batched\(budget=\).*cost"):
        list(base(docs).batched(budget=10, cost=cost))


@pytest.mark.parametrize("good", [np.float32(3.0), np.int64(3), 0, 3])
def test_numpy_and_zero_costs_are_numbers(docs: Manifest, good: Any) -> None:
    def cost(item: Any) -> Any:
        return good

    batches = list(base(docs).batched(budget=12, cost=cost, collate=list))
    assert sum(len(b) for b in batches) == 40


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, -1, True, "500", 1e309])
def test_a_budget_that_is_not_a_finite_number_above_0_is_refused(docs: Manifest, bad: Any) -> None:
    """inf was taken: every group of up to 1024 items one batch."""
    with pytest.raises(ConfigError, match="budget"):
        base(docs).batched(budget=bad, cost="tokens.npy")


@pytest.mark.parametrize("good", [np.int64(100), np.float32(100.0), np.float64(100.0)])
def test_numpy_budgets_are_numbers(docs: Manifest, good: Any) -> None:
    """np.int64(100) and np.float32(100) were refused ('must be a number > 0, got 100')."""
    want = [list(b["__key__"]) for b in base(docs).batched(budget=100, cost="tokens.npy")]
    got = [list(b["__key__"]) for b in base(docs).batched(budget=good, cost="tokens.npy")]
    assert got == want


@pytest.mark.parametrize("bad", [2.5, True, "4", float("nan"), 0])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(docs: Manifest, bad: Any) -> None:
    """batched(2.5) gave all 40 items in one batch, batched(True) batches of 1, both with
    no error; batched('4') a bare TypeError."""
    with pytest.raises(ConfigError, match="batch"):
        list(base(docs).batched(bad))
