"""The writer's and codecs' fast paths give exactly the bytes of the general ones."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardkit.format.codecs import decode_field, encode_field
from shardkit.format.tario.writer import _MAX_OCTAL_SIZE, _raw_header, member_header
from tests.helpers.strategies import member_names


@given(name=member_names, size=st.integers(min_value=0, max_value=_MAX_OCTAL_SIZE))
def test_fast_header_is_the_general_header(name: str, size: int) -> None:
    assert member_header(name, size) == _raw_header(name.encode(), b"", size, b"0")


@given(
    dtype=st.sampled_from(["<i4", ">i4", "<f8", "u1", "<i8", "?", "<f2"]),
    shape=st.lists(st.integers(min_value=0, max_value=5), max_size=3),
    transpose=st.booleans(),
)
def test_npy_encoding_matches_numpy_save(dtype: str, shape: list[int], transpose: bool) -> None:
    arr = np.arange(int(np.prod(shape)) if shape else 1).astype(dtype).reshape(shape)
    if transpose:
        arr = arr.T  # Fortran order for 2-D and up: the slow path
    for _ in range(2):  # the second call goes through the cached header
        got = encode_field("k", "x.npy", arr)
        ref = io.BytesIO()
        np.save(ref, arr, allow_pickle=False)
        assert got == ref.getvalue()
        back = decode_field("k", "x.npy", got)
        assert back.dtype == arr.dtype and back.shape == arr.shape
        assert np.array_equal(back, arr)
