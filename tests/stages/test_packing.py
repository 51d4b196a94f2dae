"""Packing maths (shardkit.stages.packing): pieces, best-fit decreasing, boundaries."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardkit.stages.packing import best_fit, collate_packed, pieces, segments_boundaries


@given(n=st.integers(0, 500), seq_len=st.integers(1, 64))
def test_pieces_cover_a_document_once(n: int, seq_len: int) -> None:
    got = pieces(n, seq_len)
    assert all(0 <= m <= seq_len for _, m in got)
    assert [o for o, _ in got] == list(np.cumsum([0] + [m for _, m in got])[:-1])
    assert sum(m for _, m in got) == n
    assert sum(1 for _, m in got if m < seq_len) <= 1  # only the last piece is short


@given(lengths=st.lists(st.integers(0, 40), max_size=60), seq_len=st.integers(40, 64))
def test_best_fit_places_every_piece_once_and_never_overfills(
    lengths: list[int], seq_len: int
) -> None:
    bins = best_fit(lengths, seq_len)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= seq_len for b in bins)
    assert all(b == sorted(b) for b in bins)
    assert [b[0] for b in bins] == sorted(b[0] for b in bins)
    # any-fit: every bin but one is more than half full, so bins <= 2 * total / seq_len + 1
    assert len(bins) <= 2 * sum(lengths) / seq_len + 1
    # no two bins could be merged when both are at most half full
    fills = sorted(sum(lengths[i] for i in b) for b in bins)
    if len(fills) >= 2 and any(lengths):
        assert fills[0] + fills[1] > seq_len or fills[0] == 0


def test_best_fit_fills_better_than_greedy_order() -> None:
    lengths = [60, 50, 40, 30, 20, 10, 70, 90, 5, 25]
    bins = best_fit(lengths, 100)
    assert len(bins) == 4  # 400 tokens in 4 bins: no padding
    assert best_fit([], 10) == []


def test_boundaries_restart_at_document_starts() -> None:
    pos, cu = segments_boundaries([(5, 3), (0, 4)], 10)
    assert pos.tolist() == [5, 6, 7, 0, 1, 2, 3, 0, 1, 2]  # a continued piece, a document, padding
    assert cu.tolist() == [0, 3, 7, 10]
    pos, cu = segments_boundaries([(0, 4), (0, 6)], 10)
    assert cu.tolist() == [0, 4, 10]


def test_collate_packed_flattens_cu_seqlens() -> None:
    a = {
        "tokens": np.arange(4),
        "position_ids": np.asarray([0, 1, 0, 1]),
        "cu_seqlens": np.asarray([0, 2, 4]),
    }
    b = {"tokens": np.arange(4), "position_ids": np.arange(4), "cu_seqlens": np.asarray([0, 4])}
    out = collate_packed([a, b])
    assert out["tokens"].shape == (2, 4)
    assert out["cu_seqlens"].tolist() == [0, 2, 4, 8]
    assert out["max_seqlen"] == 4
