"""Plan invariants for random shard sets, world sizes 1-8 and 0-4 DataLoader workers."""

from __future__ import annotations

import collections

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardkit.plan.assign import PlanConfig, epoch_sequence, worker_stream
from shardkit.plan.generation import Generation, shuffle_window
from shardkit.plan.order import Window, iter_order
from shardkit.plan.ranges import Ranges
from shardkit.plan.world import Context
from tests.helpers.strategies import counts_st, epoch_st, seed_st, workers_st, world_st


def ids(r: Ranges, counts: list[int]) -> list[int]:
    off = np.concatenate(([0], np.cumsum(counts)))
    return [int(off[s]) + i for s, lo, hi in r.rows() for i in range(lo, hi)]


def streams(
    counts: list[int],
    cfg: PlanConfig,
    epoch: int,
    world: int,
    workers: int,
    history: tuple[Generation, ...] = (),
) -> list[list[Ranges]]:
    w = max(workers, 1)
    out = []
    for rank in range(world):
        row = []
        for worker in range(w):
            s = worker_stream(counts, cfg, Context(rank, world, worker, w, epoch), history)
            assert isinstance(s, Ranges)
            row.append(s)
        out.append(row)
    return out


@given(counts_st, world_st, workers_st, seed_st, epoch_st, st.sampled_from(["drop", "pad"]))
def test_every_sample_once_and_equal_rank_counts(
    counts: list[int], world: int, workers: int, seed: int, epoch: int, remainder: str
) -> None:
    cfg = PlanConfig(seed=seed, remainder=remainder)
    n = sum(counts)
    plan = streams(counts, cfg, epoch, world, workers)
    lengths = {tuple(s.total for s in row) for row in plan}
    assert len(lengths) == 1, f"ranks differ: {lengths}"
    got = [i for row in plan for s in row for i in ids(s, counts)]
    seen = collections.Counter(got)
    if remainder == "drop":
        assert max(seen.values(), default=1) == 1
        assert len(got) == n - n % world
        if n % world == 0:
            assert sorted(got) == list(range(n))
    else:
        assert len(got) == -(-n // world) * world
        assert set(seen) == set(range(n))


@given(counts_st, world_st, workers_st, world_st, workers_st, seed_st, epoch_st)
def test_the_order_depends_on_seed_and_epoch_only(
    counts: list[int], w1: int, k1: int, w2: int, k2: int, seed: int, epoch: int
) -> None:
    """Read in (rank, worker) order, any world size and worker count give the same sequence."""
    cfg = PlanConfig(seed=seed)
    seq = ids(epoch_sequence(counts, cfg, epoch), counts)
    for world, workers in ((w1, k1), (w2, k2)):
        joined = [
            i
            for row in streams(counts, cfg, epoch, world, workers)
            for s in row
            for i in ids(s, counts)
        ]
        assert joined == seq[: len(joined)]
    again = ids(epoch_sequence(counts, PlanConfig(seed=seed), epoch), counts)
    assert again == seq


@given(st.integers(0, 400), st.integers(2, 60), st.integers(1, 60), seed_st, st.data())
def test_the_buffered_order_is_a_bounded_permutation_resumable_anywhere(
    n: int, bufsize: int, initial: int, seed: int, data: st.DataObject
) -> None:
    window = Window(bufsize, min(initial, bufsize), seed)
    order = np.concatenate([np.empty(0, dtype=np.int64), *iter_order(n, window, chunk=16)])
    assert sorted(order.tolist()) == list(range(n))
    assert all(order[p] <= p + bufsize for p in range(n))
    if n:
        p = data.draw(st.integers(1, n))
        tail = np.concatenate(
            [np.empty(0, dtype=np.int64), *iter_order(n, window, after=int(order[p - 1]))]
        )
        assert tail.tolist() == order[p:].tolist()


def _consumed(
    counts: list[int],
    cfg: PlanConfig,
    epoch: int,
    gen: Generation,
    g: int,
    history: tuple[Generation, ...],
) -> list[int]:
    out = []
    for rank, row in enumerate(streams(counts, cfg, epoch, gen.world, gen.workers, history)):
        for w, s in enumerate(row):
            window = shuffle_window(gen.bufsize, gen.initial, cfg.seed, epoch, g, rank, w)
            order = np.concatenate([np.empty(0, dtype=np.int64), *iter_order(s.total, window)])
            sid = ids(s, counts)
            out += [sid[i] for i in order[: gen.position(rank, w)]]
    return out


@given(
    counts_st,
    st.lists(st.tuples(world_st, workers_st, st.integers(0, 30)), min_size=1, max_size=3),
    world_st,
    workers_st,
    seed_st,
    st.data(),
)
def test_elastic_resume_never_repeats_and_loses_only_the_remainder(
    counts: list[int],
    gens: list[tuple[int, int, int]],
    world: int,
    workers: int,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg = PlanConfig(seed=seed)
    history: tuple[Generation, ...] = ()
    consumed: list[int] = []
    left = sum(counts)  # what each generation's plan splits (the remainder rule drops some)
    for g, (gw, gk, bufsize) in enumerate(gens):
        rows = streams(counts, cfg, 0, gw, gk, history)
        # ranks need not be in lockstep: a position per (rank, worker)
        positions = tuple(tuple(data.draw(st.integers(0, s.total)) for s in row) for row in rows)
        gen = Generation(gw, max(gk, 1), positions, bufsize or None, bufsize or None)
        now = _consumed(counts, cfg, 0, gen, g, history)
        consumed += now
        left = left - left % gw - len(now)
        history = (*history, gen)
    plan = streams(counts, cfg, 0, world, workers, history)
    after = [i for row in plan for s in row for i in ids(s, counts)]
    assert len({tuple(s.total for s in row) for row in plan}) == 1
    both = consumed + after
    assert len(set(both)) == len(both), "a sample was read twice"
    assert len(after) == left - left % world
