"""The loader's job state: unfit states refused naming the field, epochs, merge of rank
states, cheap state_dict (no dataset copy)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.errors import StateDictError
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]
SIZES = [7, 11, 3, 9, 13, 10, 7]


def loader(m: Manifest, bufsize: int = 10, **kw: Any) -> WebLoader:
    ds = ShardDataset(m, seed=1, **kw).split_by_node(0, 2).shuffle(bufsize)
    return WebLoader(ds.to_tuple("__key__").batched(3))


def keys(batches: Any) -> list[str]:
    return [k for b in batches for k in b[0]]


def saved(m: Manifest, steps: int = 4) -> dict[str, Any]:
    lo = loader(m)
    it = iter(lo)
    for _ in range(steps):
        next(it)
    return json.loads(json.dumps(lo.state_dict()))


def with_worker(state: dict[str, Any], **change: Any) -> dict[str, Any]:
    """``state`` with rank 0's worker 0 source cursor changed."""
    out = copy.deepcopy(state)
    ranks = json.loads(out["ranks"])
    ranks[0]["workers"][0].update(change)
    out["ranks"] = json.dumps(ranks)
    return out


def test_unfit_loader_states_are_refused_naming_the_field(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    twin = make_shards(SIZES, seed=9)
    state = saved(m)
    cases: list[tuple[Callable[[], WebLoader], dict[str, Any], str]] = [
        (lambda: loader(m, 50), state, "'bufsize' is 10 in the state, 50 here"),
        (lambda: loader(m, 1), state, "'bufsize' is 10 in the state, None here"),
        (lambda: loader(twin), state, "'manifest'"),
        (lambda: loader(m, handler="skip_shard"), state, "'handler'"),
        (lambda: loader(m), {**state, "epoch": -3}, "'epoch'"),
        (lambda: loader(m), {**state, "world": 0}, "'world'"),
        (lambda: loader(m), {**state, "ranks": "[not json"}, "'ranks'"),
        (lambda: loader(m), {**state, "version": 1}, "version"),
        (lambda: loader(m), with_worker(state, last=10**9), "'last'"),
        (lambda: loader(m), with_worker(state, last=-7), "'last'"),
        (lambda: loader(m), with_worker(state, position=10**9), "'position'"),
        (lambda: loader(m), with_worker(state, position=-1), "'position'"),
        (lambda: loader(m), with_worker(state, rank=1), "rank 1 worker 0's"),
        (lambda: loader(m), with_worker(state, epoch=5), "epoch"),
    ]
    for make, st, field in cases:
        with pytest.raises(StateDictError, match=re.escape(field)):
            make().load_state_dict(st)
    ranks = json.loads(state["ranks"])
    ranks[0]["rank"] = 1  # a state of rank 1 only, loaded on rank 0
    alien = {**state, "ranks": json.dumps(ranks)}
    with pytest.raises(StateDictError, match="not rank 0's"):
        loader(m).load_state_dict(alien)


def test_epochs_must_fit_unless_discarded(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    full = keys(loader(m))
    state = saved(m)
    lo = loader(m)
    lo.load_state_dict(state)
    assert lo.epoch == 0
    with pytest.raises(StateDictError, match="for epoch 0, not epoch 1"):
        lo.set_epoch(1)
    assert keys(lo) == full[12:], "the refused set_epoch lost the state"
    lo = loader(m)
    lo.load_state_dict(state, epoch_mismatch="discard")
    lo.set_epoch(1)
    assert sorted(keys(lo)) == sorted(keys(_epoch(loader(m), 1)))
    done = loader(m)
    assert keys(done) == full
    end = done.state_dict()
    for epoch, want in ((0, []), (1, keys(_epoch(loader(m), 1)))):
        again = loader(m)
        again.load_state_dict(end)
        again.set_epoch(epoch)
        assert keys(again) == want, f"an ended epoch 0 state, then set_epoch({epoch})"
    with pytest.raises(StateDictError, match="epoch 0 \\(ended\\)"):
        late = loader(m)
        late.load_state_dict(end)
        late.set_epoch(2)


def _epoch(lo: WebLoader, epoch: int) -> WebLoader:
    lo.set_epoch(epoch)
    return lo


def test_rank_states_merge_into_the_job_state(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    parts = []
    for rank in range(2):
        ds = ShardDataset(m, seed=1).split_by_node(rank, 2).shuffle(10).to_tuple("__key__")
        lo = WebLoader(ds.batched(3))
        it = iter(lo)
        for _ in range(2 + rank):
            next(it)
        parts.append(lo.state_dict())
    job = WebLoader.merge_states(parts)
    assert [r["rank"] for r in json.loads(job["ranks"])] == [0, 1]
    with pytest.raises(StateDictError, match="'epoch'"):
        WebLoader.merge_states([parts[0], {**parts[1], "epoch": 1}])


def test_state_dict_copies_no_user_code(make_shards: MakeShards) -> None:
    """A map holding an object that cannot be copied: state_dict works, and is small."""

    class Uncopyable:
        def __deepcopy__(self, memo: Any) -> Any:
            raise TypeError("no copies")

        def __call__(self, x: Any) -> Any:
            return x

    m = make_shards(SIZES)
    ds = ShardDataset(m, seed=1).shuffle(10).map(Uncopyable()).to_tuple("__key__").batched(3)
    lo = WebLoader(ds)
    assert len(json.dumps(lo.state_dict())) < 4000  # before the first batch
    it = iter(lo)
    next(it)
    state = lo.state_dict()
    again = WebLoader(
        ShardDataset(m, seed=1).shuffle(10).map(Uncopyable()).to_tuple("__key__").batched(3)
    )
    again.load_state_dict(state)
    assert keys(again) == keys(it)
