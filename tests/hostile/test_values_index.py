"""Hostile values at IndexedShards' entry: every kind of index Python would still take.

A str is a key (never a position), an int or numpy integer a position, anything else a
TypeError; out of range an IndexError naming the length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardkit as sk

N = 10
# position p holds the sample keyed KEYS[p]: keys and positions disagree everywhere
KEYS = [f"{(7 * p + 3) % N:06d}" for p in range(N)]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> sk.IndexedShards:
    out = tmp_path_factory.mktemp("keyed") / "set"
    with sk.ShardWriter(out, maxcount=4) as w:
        for p, key in enumerate(KEYS):
            w.write({"__key__": key, "txt": f"position {p}".encode()})
    return sk.IndexedShards(str(Path(out) / "manifest.json"))


def test_a_str_index_is_the_key_never_the_position(indexed: sk.IndexedShards) -> None:
    assert KEYS[3] != "000003"
    assert indexed["000003"]["__key__"] == "000003"
    assert indexed["000003"]["txt"] == f"position {KEYS.index('000003')}".encode()
    with pytest.raises(KeyError, match="'000042'"):
        indexed["000042"]
    with pytest.raises(KeyError, match="'3'"):
        indexed["3"]


@pytest.mark.parametrize("bad", [1.7, 1.0, True, False, np.bool_(True), np.float32(2), None, b"3"])
def test_a_bool_float_or_bytes_index_is_a_type_error(
    indexed: sk.IndexedShards, bad: object
) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        indexed[bad]  # type: ignore[index]
    with pytest.raises(TypeError):
        indexed.position(bad)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    i=st.integers(-3 * N, 3 * N),
    kind=st.sampled_from([int, np.int8, np.int64, np.uint8, np.intp]),
)
def test_any_integer_kind_is_a_position(indexed: sk.IndexedShards, i: int, kind: type) -> None:
    if kind is np.uint8 and i < 0:
        i = -i
    value = kind(i)
    if -N <= i < N:
        assert indexed[value]["__key__"] == KEYS[i]
        assert indexed.position(value) == i % N
    else:
        with pytest.raises(IndexError, match=f"{i} is out of range for {N} samples"):
            indexed[value]


@settings(max_examples=25, deadline=None)
@given(key=st.text(alphabet="0123456789ab/._- é", max_size=8))
def test_any_str_is_looked_up_as_a_key(indexed: sk.IndexedShards, key: str) -> None:
    if key in KEYS:
        assert indexed[key]["__key__"] == key
    else:
        with pytest.raises(KeyError):
            indexed[key]
