"""Hostile review of issue 31: a mixture's cursor never changes the state it started from."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from shardkit import Schedule, ShardDataset, WebLoader, mix
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]


def keys(batches: Any) -> list[str]:
    return [str(k) for batch in batches for k in batch["__key__"]]


def test_a_state_loaded_twice_gives_the_same_stream(make_shards: MakeShards) -> None:
    """The counts, taken and base lists of a state were the cursor's own: a state dict a
    user kept and loaded again had moved on (and so did the second stream: the exposure
    counts and the schedule's progress start from the first one's end)."""
    a, b = make_shards([15, 15], prefix="a"), make_shards([10, 10], prefix="b")

    def pipeline() -> ShardDataset:
        sets = [ShardDataset(m, seed=1).shuffle(8) for m in (a, b)]
        steps = Schedule([(0, {"a": 3, "b": 1}), (20, {"a": 1, "b": 3})])  # by progress
        return mix(sets, steps, names=["a", "b"], stop="longest").batched(3)

    for make in (pipeline, lambda: WebLoader(pipeline())):
        head = make()
        it = iter(head)
        for _ in range(4):
            next(it)
        state: dict[str, Any] = json.loads(json.dumps(head.state_dict()))
        kept = copy.deepcopy(state)
        first = make()
        first.load_state_dict(state)
        once = keys(first)
        assert state == kept  # the dict loaded is as it was (its counts had moved on)
        second = make()
        second.load_state_dict(state)
        assert keys(second) == once and once
