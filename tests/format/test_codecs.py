"""Codecs: encode/decode by extension; npy never pickles; pickle only when allowed."""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import pytest

from shardkit import DecodeError, WriterError
from shardkit.format.codecs import NpyDecoder, decode_field, encode_field, extension


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("json", {"a": [1, 2.5, "ü"], "b": None}),
        ("meta.json", [1, 2, 3]),
        ("txt", "héllo\nworld"),
        ("cls", 7),
        ("id", -3),
        ("cls", np.int64(12)),
    ],
)
def test_roundtrip_by_extension(field: str, value: Any) -> None:
    data = encode_field("k", field, value)
    assert isinstance(data, bytes)
    assert decode_field("k", field, data) == value
    assert decode_field("k", field, memoryview(data)) == value


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.arange(7, dtype=">i8"),  # one dimension: no reshape
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.zeros((0, 5), dtype=np.uint8),
        np.array(3.5, dtype=np.float16),
        np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    ],
)
def test_npy_roundtrip(arr: np.ndarray) -> None:
    data = encode_field("k", "tokens.npy", arr)
    for given in (data, memoryview(data), bytearray(data)):
        out = decode_field("k", "tokens.npy", given)
        assert out.dtype == arr.dtype and out.shape == arr.shape
        np.testing.assert_array_equal(out, arr)
    v2 = io.BytesIO()
    np.lib.format.write_array(v2, arr, version=(2, 0))
    np.testing.assert_array_equal(decode_field("k", "npy", memoryview(v2.getvalue())), arr)


def _npy(head: bytes, payload: bytes = b"") -> bytes:
    head += b" " * (-(10 + len(head) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head + payload


def test_npy_headers_read_by_match_are_numpys_reading() -> None:
    """The headers numpy writes for plain dtypes are read by a match, not literal_eval:
    the same dtype, shape, order and count as numpy's own parse, every version, order and
    rank; what the match does not take (another spacing, key order, structured, datetime,
    object dtypes) is numpy's to parse or refuse, as before."""
    arrays = [
        np.zeros(shape, dtype=dt, order=order)
        for dt in ("<i4", ">i2", "|u1", "<f8", "<c8", "|b1", "|S3", "<U2", "|V4", "<M8[ns]")
        for shape in ((), (0,), (7,), (0, 3), (2, 3), (2, 1, 4))
        for order in ("C", "F")
    ] + [np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])]
    for arr in arrays:
        for version in ((1, 0), (2, 0)):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arr, version=version)
            data = buf.getvalue()
            start = len(data) - arr.nbytes
            dec = NpyDecoder()
            out = dec(data)
            assert out.dtype == arr.dtype and out.shape == arr.shape, (arr.dtype, arr.shape)
            np.testing.assert_array_equal(out, arr)
            head = data[:start]
            assert dec.headers[head] == dec._parse_any(head, version[0], start)
    pad = b"\0" * 8
    for head in (  # near misses of the match: numpy decides
        b"{'descr': '<i4', 'shape': (2,), 'fortran_order': False, }",
        b"{'descr':'<i4', 'fortran_order': False, 'shape': (2,), }",
        b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
        b"{'descr': '<i4', 'fortran_order': 0, 'shape': (2,), }",
    ):
        try:
            want: Any = NpyDecoder()._parse_any(_npy(head), 1, len(_npy(head)))
        except Exception as e:  # noqa: BLE001 - the refusal is what is compared
            want = type(e)
        try:
            got: Any = decode_field("k", "npy", _npy(head, pad))
        except DecodeError as e:
            got = type(e.__cause__)
        if isinstance(want, tuple):
            assert got.dtype == want[0] and got.shape == want[1], head
        else:
            assert got is want or got is ValueError, (head, got, want)


def test_an_npy_claiming_a_huge_shape_is_a_decode_error() -> None:
    data = _npy(b"{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000000000, 10), }")
    with pytest.raises(DecodeError, match="k"):
        decode_field("k", "npy", data + b"\0" * 64)


def test_npy_version_3_header_is_read() -> None:
    buf = io.BytesIO()
    arr = np.arange(5, dtype=np.int16)
    np.lib.format.write_array(buf, arr, version=(3, 0))
    np.testing.assert_array_equal(decode_field("k", "npy", buf.getvalue()), arr)


def test_npy_never_pickles() -> None:
    with pytest.raises(WriterError, match="pickle"):
        encode_field("k", "x.npy", np.array([{"a": 1}], dtype=object))
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="pickle") as info:
        decode_field("k", "x.npy", buf.getvalue())
    assert (info.value.key, info.value.field) == ("k", "x.npy")


def test_truncated_npy_is_a_decode_error() -> None:
    data = encode_field("k", "npy", np.arange(100, dtype=np.int64))
    with pytest.raises(DecodeError, match="k"):
        decode_field("k", "npy", data[:-8])


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this would run code",))


def test_pickle_is_refused_unless_allowed() -> None:
    data = pickle.dumps(_Boom())
    for field in ("pickle", "x.pyd", "pth"):
        with pytest.raises(DecodeError, match="allow_pickle"):
            decode_field("k", field, data)
    value = {"a": (1, 2)}
    enc = encode_field("k", "pickle", value)
    assert decode_field("k", "pickle", enc, allow_pickle=True) == value


def test_unknown_extensions_are_bytes_and_handlers_win() -> None:
    assert decode_field("k", "jpg", b"\xff\xd8") == b"\xff\xd8"
    assert encode_field("k", "bin", bytearray(b"ab")) == b"ab"
    assert encode_field("k", "bin", "text") == b"text"
    handlers = {"jpg": lambda b: len(b), "special.json": lambda b: "mine"}
    assert decode_field("k", "x.jpg", b"abc", handlers=handlers) == 3
    assert decode_field("k", "special.json", b"{}", handlers=handlers) == "mine"


@pytest.mark.parametrize(
    ("field", "data"),
    [("json", b"{not json"), ("cls", b"seven"), ("txt", b"\xff\xfe\xfa"), ("npy", b"NUMPY")],
)
def test_bad_bytes_are_decode_errors_naming_key_and_field(field: str, data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_field("sample-1", field, data)
    assert info.value.key == "sample-1" and info.value.field == field
    assert "sample-1" in str(info.value)


def test_extension() -> None:
    assert extension("tokens.NPY") == "npy"
    assert extension("json") == "json"
