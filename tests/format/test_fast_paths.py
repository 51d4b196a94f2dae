"""The writer's and codecs' fast paths give exactly the bytes of the general ones."""

from __future__ import annotations

import io
import json
import re
from functools import partial
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardkit.errors import DecodeError
from shardkit.format.codecs import decode_field, decode_json, encode_field
from shardkit.format.tario.writer import _MAX_OCTAL_SIZE, _raw_header, member_header
from shardkit.stages.decode import Decode
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


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
_JSON_TAILS = [b"", b" ", b"\n\t \r", b" x", b"}", b",1", b"\x00", "\u00a0".encode()]


def _loads(raw: bytes) -> tuple[str, Any]:
    """``json.loads``' value, or the type of its error."""
    try:
        return "ok", json.loads(raw)
    except ValueError as exc:
        return "error", type(exc)


def _fast(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode_json(raw)
    except ValueError as exc:
        return "error", type(exc)


@given(
    value=_JSON_VALUES,
    tail=st.sampled_from(_JSON_TAILS),
    encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16-le", "utf-16", "utf-32-le"]),
    cut=st.integers(min_value=0, max_value=3),
)
def test_the_json_fast_path_decodes_as_json_loads(
    value: Any, tail: bytes, encoding: str, cut: int
) -> None:
    """Values, whitespace, trailing bytes, other encodings json.loads detects, text cut
    short: the fast path gives json.loads' value or an error of its type."""
    text = json.dumps(value, allow_nan=True)
    raw = text.encode(encoding) + tail
    for data in (raw, raw[: len(raw) - cut], memoryview(raw)):
        want, got = _loads(bytes(data)), _fast(data)
        assert got[0] == want[0], (bytes(data), want, got)
        if want[0] == "ok":  # compared as json text: NaN is not equal to itself
            assert json.dumps(got[1]) == json.dumps(want[1])
        else:
            assert got[1] is want[1]


_FIELDS = ["json", "a.JSON", "txt", "x.text", "cls", "id", "tokens.npy", "npy", "bin", "x.y.z"]
_FIELDS += ["pickle", "m.pth", "png", "JPG", "noext", "a.Cls"]


def _valid(field: str, i: int) -> bytes:
    ext = field.rsplit(".", 1)[-1].lower()
    if ext in ("json",):
        return json.dumps({"i": i, "s": "é"}).encode()
    if ext in ("txt", "text"):
        return f"text {i} é".encode()
    if ext in ("cls", "id"):
        return str(i).encode()
    if ext == "npy":
        return encode_field("k", "x.npy", np.arange(i % 7, dtype="<i4"))
    return bytes([i % 256]) * (i % 5)


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except DecodeError as exc:  # without object addresses (Pillow names its BytesIO)
        return "error", re.sub(r"0x[0-9a-f]+", "0x", str(exc))


@given(
    fields=st.lists(st.sampled_from(_FIELDS), min_size=1, max_size=5, unique=True),
    garbage=st.lists(st.binary(max_size=12), min_size=5, max_size=5),
    valid=st.lists(st.booleans(), min_size=5, max_size=5),
    i=st.integers(min_value=0, max_value=1000),
)
def test_the_decode_stage_decodes_each_field_as_decode_field(
    fields: list[str], garbage: list[bytes], valid: list[bool], i: int
) -> None:
    """The stage resolves a field's decoder once per name: every field decodes to
    decode_field's value, and bad bytes give decode_field's error, sample after sample."""
    stage = Decode(None)  # type: ignore[arg-type]
    table = stage._table.get()[0]
    for round_ in range(2):  # the second round goes through the remembered decoders
        sample: dict[str, Any] = {"__key__": f"k{i}", "__url__": "u"}
        for f, g, ok in zip(fields, garbage, valid, strict=False):
            sample[f] = _valid(f, i + round_) if ok else g
        want: dict[str, Any] = {"__key__": sample["__key__"], "__url__": "u"}
        first_error = None
        for f in fields:
            got = _outcome(partial(decode_field, sample["__key__"], f, sample[f], handlers=table))
            if got[0] == "error":
                first_error = first_error or got[1]
            want[f] = got[1]
        result = _outcome(partial(stage.decode_sample, sample))
        if first_error is not None:
            assert result == ("error", first_error)
            continue
        assert result[0] == "ok"
        assert set(result[1]) == set(want)
        for f, v in want.items():
            r = result[1][f]
            if isinstance(v, np.ndarray):
                assert isinstance(r, np.ndarray) and np.array_equal(r, v) and r.flags.writeable
            elif hasattr(v, "size") and hasattr(v, "mode"):  # a PIL image
                assert r.size == v.size and r.mode == v.mode
            else:
                assert r == v
