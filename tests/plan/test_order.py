"""The index-space shuffle window: order, cursor maths and resume points, against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.plan.order import Window, iter_order, nth_output, remaining_after, resume_window


def full_order(n: int, window: Window | None, chunk: int = 64) -> np.ndarray:
    parts = list(iter_order(n, window, chunk=chunk))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


CASES = [(0, 5, 5), (1, 5, 5), (50, 7, 3), (300, 40, 40), (999, 2, 2), (2000, 300, 10)]


@pytest.mark.parametrize(("n", "bufsize", "initial"), CASES)
def test_order_is_the_stream_sorted_by_key(n: int, bufsize: int, initial: int) -> None:
    w = Window(bufsize, initial, seed=1234)
    order = full_order(n, w)
    pos = np.arange(n)
    assert (order == np.lexsort((pos, w.keys(pos)))).all()
    assert sorted(order.tolist()) == list(range(n))
    # the buffer bound: output p comes from input <= p + bufsize
    assert all(order[p] <= p + bufsize for p in range(n))
    # and the chunking does not matter
    assert (full_order(n, w, chunk=7) == order).all()


@pytest.mark.parametrize(("n", "bufsize", "initial"), CASES[1:])
def test_cursor_maths_agree_with_the_full_order(n: int, bufsize: int, initial: int) -> None:
    w = Window(bufsize, initial, seed=99)
    order = full_order(n, w)
    for p in range(0, n, max(1, n // 23)):
        assert nth_output(n, w, p) == order[p]
        if p == 0:
            continue
        tail = full_order_after(n, w, int(order[p - 1]))
        assert tail.tolist() == order[p:].tolist()
        scattered, start_all = remaining_after(n, w, p)
        assert sorted(scattered.tolist() + list(range(start_all, n))) == sorted(order[p:].tolist())
        start, left, stop = resume_window(n, w, int(order[p - 1]))
        assert start <= stop and stop - start <= bufsize + 1
        assert set(left.tolist()) == {int(s) for s in order[p:] if s < stop}


def full_order_after(n: int, w: Window, after: int) -> np.ndarray:
    parts = list(iter_order(n, w, after=after, chunk=32))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def test_no_window_is_the_identity_and_endless_streams_work() -> None:
    assert full_order(10, None, chunk=3).tolist() == list(range(10))
    assert nth_output(10, None, 4) == 4
    assert remaining_after(10, None, 4)[1] == 4
    w = Window(100, 100, seed=5)
    it = iter_order(None, w, chunk=64)
    head = np.concatenate([next(it) for _ in range(30)])
    assert len(set(head.tolist())) == len(head)
    assert nth_output(None, w, 500) == head[500]


def test_the_order_depends_on_the_seed_only() -> None:
    a = full_order(500, Window(50, 50, seed=1))
    assert (a == full_order(500, Window(50, 50, seed=1))).all()
    assert (a != full_order(500, Window(50, 50, seed=2))).any()
    assert (a != np.arange(500)).any()


def test_initial_bounds_how_far_the_first_outputs_reach() -> None:
    order = full_order(1000, Window(200, 4, seed=3))
    assert order[0] < 4
    assert all(order[p] < p + 4 + p + 1 for p in range(20))


def test_bad_windows_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        Window(0, 1, seed=0)
    with pytest.raises(ConfigError):
        Window(10, 11, seed=0)
    with pytest.raises(IndexError):
        nth_output(5, None, 5)
