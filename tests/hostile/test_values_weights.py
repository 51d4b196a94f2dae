"""Hostile values at the mixture's entries: weights and schedule steps of every kind.

Weights are normalised exactly (``[1e308, 1e308]`` is an even mixture, never an empty one)
or refused by a ConfigError naming them; a schedule's steps are integers (numpy ones
included), never bools or fractions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import Schedule, ShardDataset, mix
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.plan.schedule import choose

MakeShards = Callable[..., Manifest]
weight = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**1100),
    st.sampled_from([np.float32(1.5), np.int64(3), np.uint8(0), np.float64(1e308), True]),
)


@settings(max_examples=25, deadline=None)
@given(ws=st.lists(weight, min_size=0, max_size=4))
def test_weights_are_normalised_exactly_or_refused_by_name(ws: list[Any]) -> None:
    try:
        sched = Schedule.constant(ws)
    except ConfigError as exc:
        assert "weight" in str(exc)
        return
    got = sched.weights_at(0)
    assert len(got) == len(ws) and math.isclose(sum(got), 1.0)
    top = max(float(w) for w in ws)
    for w, g in zip(ws, got, strict=True):
        assert not isinstance(w, bool) and math.isfinite(float(w)) and float(w) >= 0
        assert (g > 0) == (float(w) > 0)  # a weighted source is drawn, an unweighted never
        assert math.isclose(g / max(got), float(w) / top, rel_tol=1e-9)
    assert choose(0.999, got, [True] * len(got)) is not None


@pytest.mark.parametrize(
    "ws",
    [
        [math.nan, 1],
        [math.inf, 1],
        [-1, 2],
        [0, 0],
        [],
        [1e308, 1e-308],
        [1e308, 2e-42, 1e308],  # lost after the overflowing sum was scaled (hypothesis)
        [True, 1],
        ["1", 2],
    ],
)
def test_weights_no_mixture_can_follow_are_a_config_error(ws: list[Any]) -> None:
    with pytest.raises(ConfigError, match="weight"):
        Schedule.constant(ws)


def test_huge_weights_give_an_even_mixture_not_an_empty_one(make_shards: MakeShards) -> None:
    a = ShardDataset(make_shards([6], prefix="aaa"), seed=1)
    b = ShardDataset(make_shards([6], prefix="bbb", seed=1), seed=1)
    got = Counter(str(s["__url__"]).rsplit("/", 1)[1][:3] for s in mix([a, b], [1e308, 1e308]))
    assert got["aaa"] > 0 and got["bbb"] > 0  # stop="first": it ends when one runs out
    assert max(got.values()) == 6


@settings(max_examples=25, deadline=None)
@given(
    at=st.one_of(
        st.integers(0, 2**40).map(np.int64),
        st.integers(0, 2**40).map(np.uint64),
        st.integers(0, 2**40),
        st.integers(0, 2**40).map(float),
    )
)
def test_a_schedule_takes_every_integer_kind_of_step(at: Any) -> None:
    sched = Schedule([(0, [1, 0]), (at, [0, 1])])
    assert sched.weights_at(int(at)) == (0.0, 1.0)
    if int(at) > 0:
        assert sched.weights_at(int(at) - 1) == (1.0, 0.0)


@pytest.mark.parametrize("at", [True, 2.5, math.nan, math.inf, -1, "10", np.float64(0.5), None])
def test_a_step_that_is_no_integer_is_a_config_error(at: Any) -> None:
    with pytest.raises(ConfigError, match="'at'"):
        Schedule([(0, [1, 1]), (at, [1, 2])])
