"""Hostile values at the data set's numeric entries: seeds, epochs, nominal epoch lengths and
packing sizes. An int or a numpy integer is taken as the number it is; a bool, a str, a
float, None or a negative is a ConfigError naming the argument (``seed="3"`` and
``seed=True`` were read as seeds, ``mix(seed=1.5)`` as another seed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardkit as sk
from shardkit.errors import ConfigError

Entry = Callable[[str, Any], Any]
ENTRIES: dict[str, tuple[Entry, str]] = {
    "seed": (lambda m, v: sk.ShardDataset(m, seed=v), "seed"),
    "set_epoch": (lambda m, v: sk.ShardDataset(m).set_epoch(v), "epoch"),
    "mix_seed": (lambda m, v: sk.mix([sk.ShardDataset(m), sk.ShardDataset(m)], seed=v), "seed"),
    "with_epoch": (lambda m, v: sk.ShardDataset(m, resampled=True).with_epoch(v), "with_epoch"),
    "nominal": (
        lambda m, v: sk.mix([sk.ShardDataset(m)], stop="never").with_epoch(v),
        "with_epoch",
    ),
    "seq_len": (lambda m, v: sk.ShardDataset(m).pack_tokens("t", v), "seq_len"),
    "buffer": (lambda m, v: sk.ShardDataset(m).pack_tokens("t", 8, buffer=v), "buffer"),
}
LOW = {"with_epoch": 1, "nominal": 1, "seq_len": 1, "buffer": 1}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = Path(tmp_path_factory.mktemp("config")) / "set"
    with sk.ShardWriter(out, maxcount=4) as w:
        for i in range(6):
            w.write({"__key__": f"{i:04d}", "txt": b"x"})
    return str(out / "manifest.json")


not_ints = st.one_of(
    st.booleans(),
    st.sampled_from([np.bool_(True), None, "3", b"3", 1.5, 2.0, np.float64(3.0), [3]]),
    st.floats(allow_nan=True, allow_infinity=True),
)
ints = st.integers(-3, 2**40).flatmap(
    lambda i: st.sampled_from([i, np.int64(i)] + ([np.uint32(i)] if 0 <= i < 2**32 else []))
)


@settings(max_examples=25, deadline=None)
@given(entry=st.sampled_from(sorted(ENTRIES)), value=st.one_of(not_ints, ints))
def test_a_number_is_taken_as_itself_or_refused_by_name(
    manifest: str, entry: str, value: Any
) -> None:
    make, name = ENTRIES[entry]
    integral = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
    if integral and int(value) >= LOW.get(entry, 0):
        make(manifest, value)
        return
    with pytest.raises(ConfigError, match=name):
        make(manifest, value)


def test_a_numpy_seed_and_epoch_give_the_order_their_int_gives(manifest: str) -> None:
    def keys(ds: sk.ShardDataset) -> list[str]:
        return [s["__key__"] for s in ds]

    a, b = sk.ShardDataset(manifest, seed=np.int64(11)), sk.ShardDataset(manifest, seed=11)
    a.set_epoch(np.int32(3))
    b.set_epoch(3)
    assert keys(a) == keys(b)
