"""The vectorised plan equals the one-split-per-stream plan it replaced, stream for stream,
on random shard sets and elastic histories (ranks not in lockstep, with and without a
shuffle window, both remainder rules)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardkit.plan.assign import (
    PlanConfig,
    remaining_sequence,
    split,
    stream_lengths,
    worker_stream,
)
from shardkit.plan.generation import Generation
from shardkit.plan.order import Window, remaining_after, remaining_after_many
from shardkit.plan.ranges import Ranges
from shardkit.plan.world import Context
from tests.helpers.plan_reference import reference_remaining
from tests.helpers.strategies import generation_st, ref_counts_st


@given(
    ref_counts_st,
    st.lists(generation_st, max_size=3),
    st.integers(0, 2**32 - 1),
    st.integers(0, 50),
    st.sampled_from(["drop", "pad"]),
    st.booleans(),
    st.data(),
)
def test_remaining_sequence_equals_the_reference(
    counts: list[int],
    gens: list[tuple[int, int, int]],
    seed: int,
    epoch: int,
    remainder: str,
    shuffle: bool,
    data: st.DataObject,
) -> None:
    cfg = PlanConfig(seed=seed, remainder=remainder, shuffle_shards=shuffle)
    history: tuple[Generation, ...] = ()
    for world, workers, bufsize in gens:
        seq = reference_remaining(counts, cfg, epoch, history)
        assert remaining_sequence(counts, cfg, epoch, history).rows() == seq.rows()
        rows = []
        for rank in range(world):
            lengths = [split(seq, world, rank, workers, w, remainder).total for w in range(workers)]
            rows.append(tuple(data.draw(st.integers(0, n)) for n in lengths))
        initial = data.draw(st.integers(1, bufsize)) if bufsize else None
        history = (*history, Generation(world, workers, tuple(rows), bufsize or None, initial))
    want = reference_remaining(counts, cfg, epoch, history)
    assert remaining_sequence(counts, cfg, epoch, history).rows() == want.rows()
    world, workers = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 3))
    lengths = stream_lengths(sum(counts), cfg, world, workers, history)
    for rank in range(world):
        for worker in range(workers):
            got = worker_stream(counts, cfg, Context(rank, world, worker, workers, epoch), history)
            assert isinstance(got, Ranges)
            assert got.rows() == split(want, world, rank, workers, worker, remainder).rows()
            assert lengths is not None and got.total == lengths[worker]


@given(
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 90)), min_size=1, max_size=6),
    st.integers(1, 20),
    st.data(),
)
def test_remaining_after_many_equals_one_stream_at_a_time(
    streams: list[tuple[int, int]], bufsize: int, data: st.DataObject
) -> None:
    initial = data.draw(st.integers(1, bufsize))
    seeds = np.array([data.draw(st.integers(0, 2**64 - 1)) for _ in streams], dtype=np.uint64)
    lengths = np.array([n for n, _ in streams], dtype=np.int64)
    emitted = np.array([min(p, n) for n, p in streams], dtype=np.int64)
    which, scattered, tails = remaining_after_many(lengths, emitted, bufsize, initial, seeds)
    for i, (n, p) in enumerate(zip(lengths.tolist(), emitted.tolist(), strict=True)):
        window = Window(bufsize, initial, int(seeds[i]))
        want_scattered, want_tail = remaining_after(n, window, p)
        want = [*want_scattered.tolist(), *range(want_tail, n)]
        got = [*scattered[which == i].tolist(), *range(int(tails[i]), n)]
        assert got == want
