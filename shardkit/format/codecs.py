"""Encode and decode sample fields by their extension.

``json``, ``npy`` (numpy, never pickled objects), ``txt``/``text``, ``cls``/``id``/``index``
(ints); ``pickle``/``pyd``/``pth`` only when the caller passes ``allow_pickle=True``
(unpickling an untrusted shard runs its code); anything else is bytes.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit.errors import DecodeError, WriterError
from shardkit.format.images import IMAGE_EXTS, encode_image, is_image_value

__all__ = [
    "INT_EXTS",
    "NpyDecoder",
    "PICKLE_EXTS",
    "TEXT_EXTS",
    "decode_field",
    "encode_field",
    "extension",
    "field_decoder",
]

TEXT_EXTS = frozenset({"txt", "text", "transcript"})
INT_EXTS = frozenset({"cls", "cls2", "id", "index", "inx"})
JSON_EXTS = frozenset({"json", "jsn"})
NPY_EXTS = frozenset({"npy"})
PICKLE_EXTS = frozenset({"pickle", "pyd", "pth"})


def extension(field: str) -> str:
    """The codec-selecting part of a field name: ``tokens.npy`` → ``npy``."""
    return field.rsplit(".", 1)[-1].lower()


_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def _encode_npy(value: Any) -> bytes:
    arr = np.asarray(value)
    if arr.dtype.hasobject:
        raise TypeError("object arrays cannot be stored as npy without pickle")
    # numpy's header writer costs more than the data for small arrays: keep each
    # (dtype, shape) header once and append the C-order bytes.
    contiguous = arr.flags.c_contiguous and not arr.dtype.fields
    hkey = (arr.dtype.str, arr.shape)
    header = _NPY_HEADERS.get(hkey) if contiguous else None
    if header is not None:
        return header + arr.tobytes()
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    out = buf.getvalue()
    if contiguous and arr.nbytes < len(out):
        if len(_NPY_HEADERS) >= 4096:
            _NPY_HEADERS.clear()
        _NPY_HEADERS[hkey] = out[: len(out) - arr.nbytes]
    return out


def encode_field(key: str, field: str, value: Any, *, image_quality: int = 90) -> bytes:
    """Turn one field value into bytes; raise :class:`WriterError` naming it when it can't.

    A PIL image or a uint8 array in an image field (``jpg``, ``png``, ``webp``...) is
    encoded in that format (``image_quality`` for JPEG and WebP; needs Pillow).
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    ext = extension(field)
    try:
        if ext in IMAGE_EXTS and is_image_value(value):
            return encode_image(value, ext, quality=image_quality)
        if ext in JSON_EXTS:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        if ext in NPY_EXTS:
            return _encode_npy(value)
        if ext in TEXT_EXTS and isinstance(value, str):
            return value.encode("utf-8")
        if ext in INT_EXTS and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return str(int(value)).encode()
        if ext in PICKLE_EXTS and ext != "pth":
            return pickle.dumps(value, protocol=4)
        if isinstance(value, str):
            return value.encode("utf-8")
    except (
        TypeError,
        ValueError,
        OverflowError,
        AttributeError,  # pickle: "Can't pickle local object"
        RecursionError,
        OSError,  # Pillow: a mode the format cannot store
        pickle.PicklingError,
    ) as exc:
        raise WriterError(f"sample {key!r}: cannot encode field {field!r}: {exc}") from exc
    raise WriterError(
        f"sample {key!r}: cannot encode field {field!r} from {type(value).__name__}; "
        "give bytes or a value its extension knows (json, npy, txt, cls, pickle, "
        "a PIL image or uint8 array for jpg/png)"
    )


_NPY_MAGIC = b"\x93NUMPY"
_NPY_PARSED = 4096  # distinct npy headers a decoder remembers


# numpy parses an npy header with ast.literal_eval, and CPython 3.11's AST validation keeps
# one recursion-depth counter per interpreter, not per thread (cpython gh-106905): two
# threads parsing at once raised "SystemError: AST constructor recursion depth mismatch"
# now and then under thread workers. One parse at a time; a parsed header is cached.
_NPY_HEADER_LOCK = threading.Lock()
# the header numpy's writer makes for a plain (non-structured, non-object, non-datetime)
# dtype, byte for byte: read with a match where literal_eval took ~40 us and the lock above;
# anything else (a structured dtype, another writer's spacing, an object dtype) goes to numpy
_NPY_PLAIN = re.compile(
    rb"\{'descr': '([<>|][biufcSUV][0-9]{1,9})', 'fortran_order': (True|False), "
    rb"'shape': \(((?:[0-9]{1,19}, )*[0-9]{1,19},|(?:[0-9]{1,19}, )+[0-9]{1,19}|)\), \} *\n"
)


class NpyDecoder:
    """npy bytes to an array over the same buffer (no copy), never unpickling objects;
    each distinct header is parsed once per decoder (numpy parses it with
    ``literal_eval``: 40 us a field, most of the cost of a small token sample)."""

    def __init__(self) -> None:
        self.headers: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], bool, int, int]] = {}

    def __call__(self, data: bytes | memoryview) -> np.ndarray:
        major = data[6] if len(data) > 9 and data[:6] == _NPY_MAGIC else 0
        if major == 1:
            start = 10 + (data[8] | data[9] << 8)
        elif major == 2:
            start = 12 + int.from_bytes(data[8:12], "little")
        else:  # rarer versions: numpy's own reader (a copy), still without pickle
            with _NPY_HEADER_LOCK:
                arr: np.ndarray = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
            return arr
        head = data[:start] if type(data) is bytes else bytes(data[:start])
        hit = self.headers.get(head)
        if hit is None:
            hit = self._parse(head, major, start)
        dtype, shape, fortran, count, offset = hit
        out = np.frombuffer(data, dtype, count, offset)
        if fortran:
            return out.reshape(shape[::-1]).transpose()
        return out if len(shape) == 1 else out.reshape(shape)

    def _parse(
        self, head: bytes, major: int, start: int
    ) -> tuple[np.dtype[Any], tuple[int, ...], bool, int, int]:
        m = _NPY_PLAIN.fullmatch(head, 10 if major == 1 else 12)
        if m is not None:  # the header numpy writes for a plain dtype: read without parsing
            descr, fortran, dims = m.groups()
            shape = tuple(int(d) for d in dims.split(b",") if d.strip())
            hit = (np.dtype(descr.decode()), shape, fortran == b"True", math.prod(shape), start)
        else:
            hit = self._parse_any(head, major, start)
        if not 0 <= hit[3] < 1 << 62:  # past any buffer (and int64: numpy's count wraps)
            raise ValueError(f"npy header claims {math.prod(hit[1])} items")
        if len(self.headers) < _NPY_PARSED:
            self.headers[head] = hit
        return hit

    def _parse_any(
        self, head: bytes, major: int, start: int
    ) -> tuple[np.dtype[Any], tuple[int, ...], bool, int, int]:
        f = io.BytesIO(head)
        np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        with _NPY_HEADER_LOCK:  # see _NPY_HEADER_LOCK
            shape, fortran, dtype = read(f)
        if dtype.hasobject:
            raise ValueError("npy holds Python objects (pickle); refused")
        return (dtype, tuple(shape), bool(fortran), math.prod(shape), start)


_JSON = json.JSONDecoder()
_OPENERS = frozenset(b"{[")


def decode_json(data: bytes | memoryview) -> Any:
    """``json.loads`` of the bytes, the same values and errors; UTF-8 text that opens with
    ``{`` or ``[`` (nearly every json field) skips ``loads``' encoding detection and
    whitespace scans, most of a small field's cost (2.2 us of a 70-byte object here)."""
    raw = bytes(data)
    # json.loads reads bytes whose second byte is 0 as UTF-16/32 (its encoding detection)
    if len(raw) > 1 and raw[0] in _OPENERS and raw[1]:
        text = raw.decode("utf-8", "surrogatepass")
        value, end = _JSON.raw_decode(text)
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            return value
    return json.loads(raw)


def _decode_pickle(ext: str, data: bytes) -> Any:
    if ext == "pth":
        import torch  # lazy: only a caller who stored torch objects pays for it

        return torch.load(io.BytesIO(data), weights_only=False)
    return pickle.loads(data)  # noqa: S301 - only with allow_pickle=True


def decode_field(
    key: str,
    field: str,
    data: bytes,
    *,
    allow_pickle: bool = False,
    handlers: dict[str, Callable[[bytes], Any]] | None = None,
) -> Any:
    """Decode one field by its extension; raise :class:`DecodeError` naming it on failure.

    A handler says "these bytes are bad" by raising :class:`DecodeError` or ``ValueError``
    (``UnicodeDecodeError`` and ``json.JSONDecodeError`` are ValueErrors): that becomes a
    DecodeError, which the bad-data policy may skip. Any other exception from a handler is
    a bug and propagates as it is: skipping it would silently drop every sample.
    """
    ext, fn = field_decoder(field, handlers)
    try:
        if fn is not None:
            return fn(data)
        if not allow_pickle:
            raise DecodeError(
                "refusing to unpickle: an untrusted shard could run code; "
                "pass allow_pickle=True if you trust this data",
                key=key,
                field=field,
            )
        try:
            return _decode_pickle(ext, bytes(data))
        except Exception as exc:  # unpickling bad bytes raises anything: all bad data
            raise ValueError(f"cannot unpickle: {exc!r}") from exc
    except DecodeError:
        raise
    except ValueError as exc:
        raise DecodeError(f"cannot decode as {ext}: {exc}", key=key, field=field) from exc


def field_decoder(
    field: str, handlers: dict[str, Callable[[bytes], Any]] | None = None
) -> tuple[str, Callable[[Any], Any] | None]:
    """``(extension, bytes -> value)`` for a field name, as :func:`decode_field` decodes it
    (a handler for the name or the extension first); None for pickled fields, which need
    ``decode_field``'s ``allow_pickle`` check. Resolved once per field name by the decode
    stage; errors are :func:`decode_field`'s to wrap."""
    ext = extension(field)
    if handlers is not None:
        h = handlers.get(field) or handlers.get(ext)
        if h is not None:
            return ext, h
    if ext in NPY_EXTS:
        return ext, NpyDecoder()
    if ext in JSON_EXTS:
        return ext, decode_json
    if ext in TEXT_EXTS:
        return ext, _utf8
    if ext in INT_EXTS:
        return ext, _int
    if ext in PICKLE_EXTS:
        return ext, None
    return ext, _raw


def _utf8(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8")


def _int(data: bytes | memoryview) -> int:
    return int(bytes(data))


def _raw(data: bytes | memoryview) -> Any:
    return data
