"""The plan: who reads which samples in what order, pure maths checked on small cases."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from shardkit.errors import ConfigError, StateDictError
from shardkit.plan.assign import (
    PlanConfig,
    epoch_sequence,
    rank_length,
    remaining_sequence,
    shard_order,
    split,
    worker_lengths,
    worker_stream,
)
from shardkit.plan.generation import Generation
from shardkit.plan.order import iter_order
from shardkit.plan.ranges import Ranges
from shardkit.plan.resampled import ResampledStream
from shardkit.plan.world import Context

COUNTS = [7, 11, 3, 9, 13, 10, 7]  # 60 samples in 7 uneven shards


def ids(r: Ranges, counts: list[int]) -> list[int]:
    """Global sample ids (shard offset + index) of a range sequence."""
    off = np.concatenate(([0], np.cumsum(counts)))
    return [int(off[s]) + i for s, lo, hi in r.rows() for i in range(lo, hi)]


def test_ranges_take_pick_wrap_and_coalesce() -> None:
    r = Ranges.of([(2, 0, 3), (0, 5, 7), (1, 0, 4)])
    assert r.total == 9
    assert r.take(2, 6).rows() == [(2, 2, 3), (0, 5, 7), (1, 0, 1)]
    assert r.take(5, 5).rows() == []
    assert r.pick(np.array([0, 1, 4, 5, 8])).rows() == [(2, 0, 2), (0, 6, 7), (1, 0, 1), (1, 3, 4)]
    assert r.wrap(20).total == 20
    assert r.wrap(20).take(9, 18).rows() == r.rows()
    assert Ranges.concat([Ranges.of([(1, 0, 2)]), Ranges.of([(1, 2, 5)])]).rows() == [(1, 0, 5)]
    assert list(r.iter_ranges(4)) == [(0, 6, 7, 4), (1, 0, 4, 5)]


def test_shard_order_is_a_seeded_permutation_per_epoch() -> None:
    a = shard_order(50, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(50))
    assert (a == shard_order(50, seed=1, epoch=0)).all()
    assert (a != shard_order(50, seed=1, epoch=1)).any()
    assert (a != shard_order(50, seed=2, epoch=0)).any()
    assert shard_order(5, 1, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_lengths_and_remainders() -> None:
    assert rank_length(60, 7, "drop") == 8
    assert rank_length(60, 7, "pad") == 9
    assert worker_lengths(8, 3) == [3, 3, 2]
    assert worker_lengths(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ConfigError):
        PlanConfig(remainder="wrap")
    with pytest.raises(ConfigError):
        worker_lengths(3, 0)


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_every_rank_gets_the_same_count_and_the_union_is_the_epoch(remainder: str) -> None:
    cfg = PlanConfig(seed=3, remainder=remainder)
    n = sum(COUNTS)
    for world in (1, 2, 3, 7, 8, 61):
        for workers in (1, 2, 4):
            got: list[int] = []
            per_rank = set()
            for rank in range(world):
                streams = [
                    worker_stream(COUNTS, cfg, Context(rank, world, w, workers, 1))
                    for w in range(workers)
                ]
                per_rank.add(tuple(s.total for s in streams))  # type: ignore[union-attr]
                for s in streams:
                    got += ids(s, COUNTS)  # type: ignore[arg-type]
            assert len(per_rank) == 1, "ranks differ in their per-worker lengths"
            count = collections.Counter(got)
            if remainder == "drop":
                assert max(count.values(), default=1) == 1 and len(got) == n - n % world
            else:
                assert set(count) == set(range(n)) and len(got) == -(-n // world) * world


def test_ranks_read_the_epoch_sequence_in_order() -> None:
    """Concatenated in (rank, worker) order, the streams are the epoch's sequence."""
    cfg = PlanConfig(seed=9)
    seq = ids(epoch_sequence(COUNTS, cfg, 4), COUNTS)
    joined = []
    for rank in range(3):
        for w in range(2):
            joined += ids(split(epoch_sequence(COUNTS, cfg, 4), 3, rank, 2, w, "drop"), COUNTS)
    assert joined == seq[: len(joined)] and len(joined) == 60


def consumed_by(gen: Generation, cfg: PlanConfig, epoch: int) -> list[int]:
    """Brute force: what each worker of a generation emitted, from its full shuffled order."""
    out = []
    for rank in range(gen.world):
        for w in range(gen.workers):
            stream = worker_stream(COUNTS, cfg, Context(rank, gen.world, w, gen.workers, epoch))
            assert isinstance(stream, Ranges)
            window = gen.window(cfg.seed, epoch, 0, rank, w)
            order = np.concatenate(list(iter_order(stream.total, window)))
            sid = ids(stream, COUNTS)
            out += [sid[i] for i in order[: gen.position(rank, w)]]
    return out


@pytest.mark.parametrize(
    "positions",
    [
        ((5, 10), (5, 10)),
        ((5, 9), (5, 9)),
        ((0, 0), (0, 0)),
        ((15, 15), (15, 15)),
        ((15, 2), (0, 11)),
        ((3, 0), (15, 15)),
    ],
)
def test_elastic_generation_leaves_exactly_the_unconsumed_samples(
    positions: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    """Ranks in lockstep or not (a filter or a skip makes them consume at other rates)."""
    cfg = PlanConfig(seed=3)
    gen = Generation(world=2, workers=2, positions=positions, bufsize=6, initial=6)
    consumed = consumed_by(gen, cfg, 0)
    left = ids(remaining_sequence(COUNTS, cfg, 0, [gen]), COUNTS)
    assert sorted(consumed + left) == list(range(60))
    after: list[int] = []
    for rank in range(3):
        stream = worker_stream(COUNTS, cfg, Context(rank, 3), [gen])
        assert isinstance(stream, Ranges)
        after += ids(stream, COUNTS)
    both = consumed + after
    assert len(set(both)) == len(both), "a sample was read twice"
    # what is left divides among 3 ranks; the remainder rule drops the rest
    assert len(after) == 3 * (len(left) // 3)
    assert set(range(60)) - set(both) == set(left[len(after) :])


def test_generation_state_round_trip_and_validation() -> None:
    gen = Generation(2, 2, ((3, 4), (5, 0)), 10, 5)
    assert Generation.from_dict(gen.to_dict()) == gen
    legacy = Generation.from_dict({"world": 2, "workers": 2, "positions": [3, 4]})
    assert legacy.positions == ((3, 4), (3, 4)), "a flat list is the same on every rank"
    bad: list[object] = [
        {"world": 2, "workers": 3, "positions": [1]},
        {"world": "x"},
        {"world": 2, "workers": 1, "positions": [[1], [-7]]},
        {"world": 2, "workers": 1, "positions": [[1], [True]]},
        {"world": 2, "workers": 1, "positions": [[1]]},
        {"world": 0, "workers": 1, "positions": []},
        {"world": 1, "workers": 1, "positions": [[1]], "bufsize": "8"},
        "not a dict",
    ]
    for raw in bad:
        with pytest.raises(StateDictError):
            Generation.from_dict(raw)
    too_far = Generation(1, 1, ((10**9,),))
    with pytest.raises(StateDictError, match="emitted 1000000000"):
        remaining_sequence(COUNTS, PlanConfig(), 0, [too_far])


def test_resampled_streams_are_seeded_weighted_and_sized() -> None:
    s = ResampledStream([1, 0, 99], seed=7, length=None)
    draws = s.draws(0, 2000)
    assert (draws == ResampledStream([1, 0, 99], seed=7, length=None).draws(0, 2000)).all()
    assert 1 not in draws.tolist() and (draws == 2).mean() > 0.9
    sized = ResampledStream([4, 6], seed=1, length=25)
    rows = list(sized.iter_ranges(0))
    assert sum(hi - lo for _, lo, hi, _ in rows) == 25
    assert [r[3] for r in rows] == list(np.cumsum([0] + [hi - lo for _, lo, hi, _ in rows])[:-1])
    tail = list(sized.iter_ranges(13))
    assert tail[0][3] == 13 and sum(hi - lo for _, lo, hi, _ in tail) == 12
    cfg = PlanConfig(seed=1, resampled=True, epoch_length=10)
    lengths = [
        worker_stream(COUNTS, cfg, Context(r, 2, w, 3)).length for r in range(2) for w in range(3)
    ]  # type: ignore[union-attr]
    assert lengths == [4, 3, 3, 4, 3, 3]
    with pytest.raises(ConfigError):
        ResampledStream([0, 0], seed=1, length=None)


def test_resampled_elastic_generations_keep_the_epoch_length() -> None:
    """40 samples per epoch at 2 ranks; 2 x (4 + 6) consumed; 20 left for 3 ranks: 6 each."""
    cfg = PlanConfig(seed=1, resampled=True, epoch_length=20)
    gen = Generation(world=2, workers=2, positions=((4, 6), (4, 6)))
    lengths = []
    streams = []
    for rank in range(3):
        stream = worker_stream(COUNTS, cfg, Context(rank, 3, 0, 2), [gen])
        assert isinstance(stream, ResampledStream)
        lengths.append(stream.length)
        streams.append(stream)
        again = worker_stream(COUNTS, cfg, Context(rank, 3, 0, 2), [gen])
        assert isinstance(again, ResampledStream)
        assert (again.draws(0, 50) == stream.draws(0, 50)).all()
    assert lengths == [3, 3, 3]
    first = worker_stream(COUNTS, cfg, Context(0, 3, 0, 2))
    assert isinstance(first, ResampledStream)
    assert (first.draws(0, 50) != streams[0].draws(0, 50)).any(), "a new generation draws anew"


def test_ranges_name_their_shards_once_in_reading_order() -> None:
    rows = Ranges.of([(3, 0, 2), (1, 0, 5), (3, 2, 4), (0, 0, 1), (1, 5, 6)])
    assert rows.shards() == [3, 1, 0]
    assert Ranges.of([]).shards() == []
