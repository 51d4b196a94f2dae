"""Mixture schedules (shardkit.plan.schedule): weights over progress, and draws that follow
them (realized shares within an Azuma-Hoeffding bound of the scheduled weights)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkit.errors import ConfigError
from shardkit.plan.order import stream_seed, uniforms
from shardkit.plan.schedule import Schedule, choose

DELTA = 1e-9  # the chance a bound below is exceeded by a correct draw sequence


def bound(n: int) -> float:
    """Azuma-Hoeffding: a count of n draws, each in [0, 1], stays within this of the sum of
    its probabilities except with probability DELTA."""
    return math.sqrt(n * math.log(2 / DELTA) / 2)


def test_step_and_linear_weights() -> None:
    s = Schedule([(0, [3, 1]), (100, [1, 1])])
    assert s.weights_at(0) == (0.75, 0.25)
    assert s.weights_at(99.9) == (0.75, 0.25)
    assert s.weights_at(100) == (0.5, 0.5)
    assert s.weights_at(10**9) == (0.5, 0.5)
    lin = Schedule([(100, [1, 0]), (200, [0, 1])], interpolate="linear")
    assert lin.weights_at(0) == (1.0, 0.0)  # before the first point: its weights
    assert lin.weights_at(150) == (0.5, 0.5)
    assert lin.weights_at(175) == (0.25, 0.75)
    assert lin.weights_at(500) == (0.0, 1.0)
    assert s.next_change(5) == 100 and s.next_change(100) == math.inf


def test_named_weights_bind_to_names_and_bad_schedules_are_refused() -> None:
    s = Schedule([(0, {"web": 3, "code": 1}), (10, {"math": 1})]).bind(["web", "code", "math"])
    assert s.points == [(0.0, (0.75, 0.25, 0.0)), (10.0, (0.0, 0.0, 1.0))]
    with pytest.raises(ConfigError, match="unknown sources"):
        Schedule([(0, {"book": 1})]).bind(["web"])
    with pytest.raises(ConfigError, match="bind"):
        _ = Schedule([(0, {"web": 1})]).points
    with pytest.raises(ConfigError, match="before the point before"):
        Schedule([(5, [1]), (4, [1])])
    with pytest.raises(ConfigError, match="one weight per source"):
        Schedule([(0, [1, 1]), (4, [1])])
    with pytest.raises(ConfigError, match="positive sum"):
        Schedule([(0, [0, 0])])
    with pytest.raises(ConfigError, match="unit"):
        Schedule([(0, [1])], unit="bytes")
    with pytest.raises(ConfigError, match="2 sources"):
        Schedule([(0, [1, 2, 3])]).bind(["a", "b"])
    with pytest.raises(ConfigError, match="'at'"):
        Schedule([(-1, [1])])


def test_choose_skips_inactive_and_weightless_sources() -> None:
    assert choose(0.0, [0.5, 0.5], [False, True]) == 1
    assert choose(0.999, [0.5, 0.0, 0.5], [True, True, False]) == 0
    assert choose(0.3, [0.0, 1.0], [True, False]) is None


def draws(s: Schedule, seed: int, n: int) -> np.ndarray:
    us = uniforms(stream_seed(seed, 0x313), np.arange(n, dtype=np.int64)).tolist()
    active = [True] * len(s)
    out = [choose(u, s.weights_at(t), active) for t, u in enumerate(us)]
    return np.asarray(out)


@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 4),
    cuts=st.lists(st.integers(1, 3000), min_size=0, max_size=3, unique=True),
    raw=st.lists(st.lists(st.integers(0, 9), min_size=4, max_size=4), min_size=4, max_size=4),
    linear=st.booleans(),
)
def test_realized_shares_follow_the_schedule(
    seed: int, k: int, cuts: list[int], raw: list[list[int]], linear: bool
) -> None:
    ats = [0, *sorted(cuts)]
    points = [
        (a, [w + (1 if j == 0 else 0) for j, w in enumerate(raw[i][:k])]) for i, a in enumerate(ats)
    ]
    s = Schedule(points, interpolate="linear" if linear else "step")
    n = 4000
    got = draws(s, seed, n)
    expected = np.sum([s.weights_at(t) for t in range(n)], axis=0)  # sum of probabilities
    # every window between two points, and the whole run, within the bound
    edges = [*ats, n]
    for lo, hi in itertools.pairwise(edges):
        if hi <= lo:
            continue
        window = got[lo:hi]
        exp = np.sum([s.weights_at(t) for t in range(lo, hi)], axis=0)
        for j in range(k):
            assert abs(int(np.sum(window == j)) - exp[j]) <= bound(hi - lo), (lo, hi, j)
    for j in range(k):
        assert abs(int(np.sum(got == j)) - expected[j]) <= bound(n)
        if all(s.weights_at(t)[j] == 0 for t in range(n)):
            assert not np.any(got == j)  # a weightless source is never drawn


@given(seed=st.integers(0, 2**32 - 1))
def test_draws_are_a_pure_function_of_seed_and_progress(seed: int) -> None:
    s = Schedule([(0, [1, 2, 3]), (50, [3, 2, 1])])
    assert draws(s, seed, 200).tolist() == draws(s, seed, 200).tolist()
    us = uniforms(stream_seed(seed, 0x313), np.arange(120, 200, dtype=np.int64)).tolist()
    tail = [
        choose(u, s.weights_at(t), [True] * 3) for t, u in zip(range(120, 200), us, strict=True)
    ]
    assert tail == draws(s, seed, 200).tolist()[120:]  # draw t needs nothing before t
