"""load_state_dict(allow=...): a run goes on after a batch-size, budget, sources, seq_len or
weights change, refused by default naming the change and the allow value; never a sample
twice, nothing skipped where the change defines it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit import ShardDataset, StateDictError, WebLoader, mix
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]


def base(m: Manifest, seed: int = 2) -> ShardDataset:
    return ShardDataset(m, seed=seed).shuffle(16).decode()


def keys_of(batch: Any) -> list[str]:
    return list(batch["__key__"])


def loader(ds: ShardDataset, workers: int) -> WebLoader:
    return WebLoader(ds, num_workers=workers, multiprocessing_context="fork" if workers else None)


def head_and_state(ld: WebLoader, steps: int) -> tuple[list[Any], dict[str, Any]]:
    it = iter(ld)
    head = [next(it) for _ in range(steps)]
    return head, json.loads(json.dumps(ld.state_dict()))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_batch_size_goes_on_at_the_first_sample_not_given(
    make_shards: MakeShards, workers: int
) -> None:
    m = make_shards([20, 17, 23])
    full = [k for b in loader(base(m).batched(4), workers) for k in keys_of(b)]
    head, state = head_and_state(loader(base(m).batched(4), workers), 5)
    ramp = loader(base(m).batched(8), workers)
    with pytest.raises(
        StateDictError, match=r"batched\(4\) -> batched\(8\).*allow=\{'batch_size'\}"
    ):
        ramp.load_state_dict(state)
    ramp.load_state_dict(state, allow={"batch_size"})
    assert ramp.remaining() is None
    tail = list(ramp)
    assert all(len(keys_of(b)) == 8 for b in tail[:-2])
    got = [k for b in head for k in keys_of(b)] + [k for b in tail for k in keys_of(b)]
    if workers == 0:
        assert got == full  # one stream: exactly the uninterrupted run's order
    assert sorted(got) == sorted(full) and len(set(got)) == len(got)


@pytest.mark.parametrize("workers", [0, 2])
def test_budget_and_plain_batches_hand_over_nothing_twice_nothing_skipped(
    tmp_path: Path, workers: int
) -> None:
    m = lognormal_shards(tmp_path / "d", n=120)

    def budget(b: int) -> ShardDataset:
        return base(m).batched(budget=b, cost="tokens.npy", buffer=20)

    everything = sorted(f"doc-{i:06d}" for i in range(120))
    steps = [(base(m).batched(5), budget(4000)), (budget(4000), base(m).batched(5))]
    steps.append((budget(4000), budget(9000)))
    for before, after in steps if workers == 0 else steps[1:2]:
        head, state = head_and_state(loader(before, workers), 4)
        ld = loader(after, workers)
        ld.load_state_dict(state, allow={"batch_size"})
        got = [k for b in head + list(ld) for k in keys_of(b)]
        assert sorted(got) == everything, "a sample twice or skipped"
        # saved mid-replay and loaded again (the same pipeline): still exact
        head2, state2 = head_and_state(loader(before, workers), 4)
        ld2 = loader(after, workers)
        ld2.load_state_dict(state2, allow={"batch_size"})
        it = iter(ld2)
        mid = [next(it)]
        again = loader(after, workers)
        again.load_state_dict(json.loads(json.dumps(ld2.state_dict())))
        got2 = [k for b in head2 + mid + list(again) for k in keys_of(b)]
        assert sorted(got2) == everything


def test_a_new_seq_len_goes_on_at_the_first_token_not_given(make_shards: MakeShards) -> None:
    m = make_shards([9, 8], tokens=50)

    def packed(seq_len: int) -> ShardDataset:
        return base(m).pack_tokens("tokens.npy", seq_len).batched(2)

    full = np.concatenate([np.asarray(b).ravel() for b in loader(packed(32), 0)])
    head, state = head_and_state(loader(packed(32), 0), 3)
    ld = loader(packed(48), 0)
    with pytest.raises(StateDictError, match=r"seq_len 32 -> 48.*allow=\{'seq_len'\}"):
        ld.load_state_dict(state)
    ld.load_state_dict(state, allow={"seq_len"})
    tail = list(ld)
    assert all(np.asarray(b).shape[1] == 48 for b in tail)
    got = np.concatenate([np.asarray(b).ravel() for b in head + tail])
    assert np.array_equal(got, full[: len(got)]) and len(full) - len(got) < 48 * 2


def mixed(parts: dict[str, Manifest], weights: dict[str, float]) -> ShardDataset:
    names = list(parts)
    sets = [ShardDataset(parts[n], seed=1).shuffle(8).decode() for n in names]
    return mix(sets, weights=[weights[n] for n in names], names=names, stop="longest").batched(3)


def test_weights_change_by_allow_or_the_reweight_alias(make_shards: MakeShards) -> None:
    a, b = make_shards([12, 12], prefix="a"), make_shards([12, 12], prefix="b")
    _, state = head_and_state(loader(mixed({"a": a, "b": b}, {"a": 1, "b": 1}), 2), 3)
    for kw in ({"allow": {"weights"}}, {"reweight": True}):
        ld = loader(mixed({"a": a, "b": b}, {"a": 3, "b": 1}), 2)
        ld.load_state_dict(state, **kw)  # type: ignore[arg-type]
        tail = list(ld)
        assert len(set(ids(tail, "a") + ids(tail, "b"))) == 48 - 9
    with pytest.raises(StateDictError, match=r"allow=\{'weights'\}"):
        loader(mixed({"a": a, "b": b}, {"a": 3, "b": 1}), 2).load_state_dict(state)


def ids(batches: list[Any], source: str) -> list[str]:
    """The samples of ``source`` (its shards' prefix) in ``batches``: url name and key."""
    out = []
    for x in batches:
        for url, key in zip(x["__url__"], x["__key__"], strict=True):
            if Path(url).name.startswith(f"{source}-"):
                out.append(f"{Path(url).name}/{key}")
    return out


def test_sources_added_removed_and_renamed(make_shards: MakeShards) -> None:
    a = make_shards([15, 15], prefix="a")
    b = make_shards([10, 10], prefix="b")
    c = make_shards([6, 6], prefix="c", seed=9)
    first = loader(mixed({"a": a, "b": b}, {"a": 1, "b": 1}), 2)
    head, state = head_and_state(first, 6)
    before = first.stats()["sources"]
    later = loader(mixed({"web": a, "code": c}, {"web": 1, "code": 1}), 2)
    with pytest.raises(
        StateDictError, match=r"removed \['a', 'b'\], added \['code', 'web'\].*allow=\{'sources'\}"
    ):
        later.load_state_dict(state, allow={"weights"})
    later.load_state_dict(state, allow={"sources": {"a": "web"}})
    stats = later.stats()["sources"]
    assert stats["b"]["samples"] == before["b"]["samples"] > 0  # a removed source's exposure
    assert stats["web"]["samples"] == before["a"]["samples"] and stats["code"]["samples"] == 0
    resaved = later.state_dict()
    tail = list(later)
    head_a, tail_a = ids(head, "a"), ids(tail, "a")
    assert not set(head_a) & set(tail_a) and len(head_a) + len(tail_a) == 30
    assert sorted(ids(tail, "c")) == sorted(set(ids(tail, "c"))) and len(ids(tail, "c")) == 12
    assert not ids(tail, "b")
    assert later.stats()["sources"]["b"]["samples"] == before["b"]["samples"]
    again = loader(mixed({"web": a, "code": c}, {"web": 1, "code": 1}), 2)
    again.load_state_dict(resaved)  # saved again, it fits the new pipeline
    assert again.stats()["sources"]["b"]["samples"] == before["b"]["samples"]


def test_a_new_seq_len_under_best_fit_goes_on_at_the_next_group(tmp_path: Path) -> None:
    m = lognormal_shards(tmp_path / "d", n=120)  # document i's tokens are all i

    def packed(seq_len: int) -> ShardDataset:
        return (
            base(m)
            .pack_tokens("tokens.npy", seq_len, strategy="best_fit", buffer=16, pad=-1)
            .batched(2)
        )

    head, state = head_and_state(loader(packed(2048), 0), 3)
    ld = loader(packed(512), 0)
    ld.load_state_dict(state, allow={"seq_len"})
    tail = list(ld)
    assert all(np.asarray(b).shape[1] == 512 for b in tail)
    tokens = np.concatenate([np.asarray(b).ravel() for b in head + tail])
    counts = np.bincount(tokens[tokens >= 0], minlength=120)
    lengths = np.array([np.asarray(s["tokens.npy"]).size for s in base(m)])
    keys = [s["__key__"] for s in base(m)]
    by_doc = np.zeros(120, dtype=np.int64)
    by_doc[[int(k.split("-")[1]) for k in keys]] = lengths
    assert (counts <= by_doc).all(), "a token given twice"
    assert counts.sum() > 0.8 * by_doc.sum()


def test_sources_and_weights_change_on_another_worker_count(make_shards: MakeShards) -> None:
    a = make_shards([15, 15], prefix="a")
    b = make_shards([10, 10], prefix="b")
    c = make_shards([6, 6], prefix="c", seed=9)
    head, state = head_and_state(loader(mixed({"a": a, "b": b}, {"a": 1, "b": 1}), 2), 6)
    later = loader(mixed({"a": a, "c": c}, {"a": 1, "c": 3}), 1)  # 2 workers -> 1
    later.load_state_dict(state, allow={"sources", "weights"})
    tail = list(later)
    head_a, tail_a = ids(head, "a"), ids(tail, "a")
    assert not set(head_a) & set(tail_a) and len(set(tail_a)) == len(tail_a)
    assert len(head_a) + len(tail_a) == 30, "a kept source gives the rest of its epoch"
    assert len(set(ids(tail, "c"))) == len(ids(tail, "c")) == 12 and not ids(tail, "b")


def test_a_replayed_group_survives_a_worker_count_change(tmp_path: Path) -> None:
    """budget -> batched(5) (allow batch_size), saved while the replay holds the budget
    group's rest, then loaded on another worker count: batched(n)'s merge gives that rest
    (it was left out and not counted), every document once."""
    m = lognormal_shards(tmp_path / "d", n=120)

    def threads(ds: ShardDataset, workers: int) -> WebLoader:
        return WebLoader(ds, num_workers=workers, worker_mode="thread")

    head, state = head_and_state(
        threads(base(m).batched(budget=4000, cost="tokens.npy", buffer=20), 2), 2
    )
    ramp = threads(base(m).batched(5), 2)
    ramp.load_state_dict(state, allow={"batch_size"})
    it = iter(ramp)
    head.append(next(it))
    state = json.loads(json.dumps(ramp.state_dict()))
    assert "regroup" in json.dumps(state)  # the replay holds some of the group
    one = threads(base(m).batched(5), 1)
    one.load_state_dict(state)
    got = [k for b in head + list(one) for k in keys_of(b)]
    assert sorted(got) == sorted(f"doc-{i:06d}" for i in range(120))
    assert one.stats()["dropped_samples"] == 0


def test_a_data_sets_load_takes_allow_as_the_loaders(make_shards: MakeShards) -> None:
    """ShardDataset.load_state_dict refuses a batching change by default naming it and the
    allow value, and with allow= goes on at the first sample not given (a budget group's
    rest first); a mixture's source removed goes by allow={'sources'} too."""
    m = make_shards([20, 17, 23])
    full = [k for b in base(m).batched(4) for k in keys_of(b)]
    head_ds = base(m).batched(budget=300, cost=lambda s: 50, buffer=12)
    it = iter(head_ds)
    head = [next(it) for _ in range(2)]  # a group of 12 holds 6 more
    state = json.loads(json.dumps(head_ds.state_dict()))
    ramp = base(m).batched(4)
    with pytest.raises(StateDictError, match=r"batched\(budget=300.*-> batched\(4\).*'batch_size'"):
        ramp.load_state_dict(state)
    ramp.load_state_dict(state, allow={"batch_size"})
    got = [k for b in head + list(ramp) for k in keys_of(b)]
    assert sorted(got) == sorted(full)  # nothing twice, nothing skipped

    a, b = make_shards([10], prefix="a"), make_shards([10], prefix="b", seed=4)
    both = mixed({"a": a, "b": b}, {"a": 1, "b": 1})
    it = iter(both)
    first = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(both.state_dict()))
    only_a = mixed({"a": a}, {"a": 1})
    with pytest.raises(StateDictError, match=r"removed \['b'\].*allow=\{'sources'\}"):
        only_a.load_state_dict(state, allow={"weights"})
    only_a.load_state_dict(state, allow={"sources", "weights"})
    kept = ids(first, "a") + ids(list(only_a), "a")
    assert len(kept) == len(set(kept)) == 10  # the kept source goes on from its cursor


@pytest.mark.parametrize("workers", [2, 1])
def test_a_sources_change_leaves_a_held_budget_group_out_counted(
    tmp_path: Path, workers: int
) -> None:
    """A budget batching holds a group drawn from the old sources: after a sources change
    (2 workers -> 2, and -> 1) it goes on after the group, its rest counted as dropped and
    not as exposure (the group read again drew other samples: c's given twice on 1 worker,
    a StateDictError on 2)."""
    sizes = {"a": 60, "b": 40, "c": 30}
    parts = {
        n: lognormal_shards(tmp_path / n, n=k, shards=2, seed=i)
        for i, (n, k) in enumerate(sizes.items())
    }

    def make(names: str, w: int) -> WebLoader:
        sets = [ShardDataset(parts[n], seed=2).decode() for n in names]
        ds = mix(sets, weights=[1.0] * len(names), names=list(names), stop="longest")
        ds = ds.batched(budget=2000, cost="tokens.npy", buffer=30)
        return WebLoader(ds, num_workers=w, worker_mode="thread")

    head, state = head_and_state(make("ab", 2), 3)
    later = make("ac", workers)
    later.load_state_dict(state, allow={"sources"})
    tail = list(later)

    def of(batches: list[Any], source: str) -> list[str]:  # by the shards' folder
        keys = [(Path(u).parent.name, k) for b in batches for u, k in zip(*_uk(b), strict=True)]
        return [k for d, k in keys if d == source]

    got = {n: of(head + tail, n) for n in "abc"}
    assert all(len(v) == len(set(v)) for v in got.values()), "a sample twice"
    assert len(got["c"]) == 30 and not of(tail, "b")
    exposure = later.stats()["sources"]
    assert {n: exposure[n]["samples"] for n in "abc"} == {n: len(got[n]) for n in "abc"}
    assert later.stats()["dropped_samples"] > 0  # the held groups' rest, never given


def _uk(batch: Any) -> tuple[list[str], list[str]]:
    return list(batch["__url__"]), list(batch["__key__"])
