"""Where a batch's values go in a worker's shared-memory slot
(:mod:`shardkit.streaming.arena`): :func:`collect` replaces what is worth a slot (big
arrays, CPU tensors, lists of arrays of one dtype, lists of bytes) with :class:`Ref`
placeholders laid out after the slot's header, and :func:`write` copies each value to its
place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.errors import TransferError
from shardkit.streaming.transfer import (
    atoms,
    bytes_offsets,
    c_order,
    join_bytes,
    tensorable,
)

__all__ = ["HEAD", "Ref", "collect", "write"]

HEAD = 64  # bytes before a slot's data: the sequence number of the batch in it
_ALIGN = 64
_ARRAY_MIN = 1024  # smaller arrays (lists of arrays: in all) pickle with the structure


@dataclass
class Ref:
    """A placeholder in a parcel's structure: ``nbytes`` at ``offset`` of the slot."""

    kind: str  # "array", "tensor", "arrays" (a list of them, one dtype) or "bytes"
    offset: int
    nbytes: int
    dtype: Any = None  # numpy dtype str, a torch dtype, or the bytes' offsets
    shape: tuple[int, ...] = ()  # of an array; of each of "arrays" but the first dimension
    rows: list[int] | None = None  # "arrays": each one's first dimension
    index: int = 0  # its value's place in the batch's values (an InlineBatch's)


def collect(x: Any, found: list[tuple[Ref, Any]], end: list[int]) -> Any:
    """``x`` with what goes into the slot replaced by :class:`Ref` placeholders (the
    containers :func:`~shardkit.streaming.transfer.deliver` walks, and only those)."""
    t = type(x)
    if t is np.ndarray:
        if not tensorable(x):  # C order before pickle: it drops a strided array's byte order
            return c_order(x)
        if x.nbytes < _ARRAY_MIN:
            return x
        return _place(Ref("array", 0, x.nbytes, x.dtype.str, x.shape), x, found, end)
    if t is torch.Tensor:
        if x.is_conj() or x.is_neg():  # torch's sharing drops these bits: wrong values
            x = _resolved(x)
        if x.device.type != "cpu" or x.layout != torch.strided or x.is_quantized:
            return x
        if x.requires_grad or x.nbytes < _ARRAY_MIN:
            return x
        return _place(Ref("tensor", 0, x.nbytes, x.dtype, tuple(x.shape)), x, found, end)
    if t is dict:
        if atoms(x.values()):
            return x
        return {k: collect(v, found, end) for k, v in x.items()}
    if t is tuple:
        return tuple(collect(v, found, end) for v in x)
    if t is list and x:
        offsets = bytes_offsets(x)
        if offsets is not None:
            return _place(Ref("bytes", 0, offsets[-1], offsets), x, found, end)
        if atoms(x):
            return x
        ref = _arrays(x)
        if ref is not None:
            return _place(ref, x, found, end)
        return [collect(v, found, end) for v in x]
    return x


def _resolved(x: torch.Tensor) -> torch.Tensor:
    """A lazy conjugate or negation made real (a worker's pickle would drop it)."""
    if x.requires_grad:
        raise TransferError(
            f"a conjugate or negative view of shape {tuple(x.shape)} that needs grad cannot "
            "cross to the training process (torch's sharing drops the view's sign): "
            "resolve_conj()/resolve_neg() it in the pipeline, or use worker_mode='thread'"
        )
    return x.resolve_conj().resolve_neg()


def _arrays(x: list[Any]) -> Ref | None:
    """A list of tensorable arrays of one dtype and one shape but the first dimension, of
    at least _ARRAY_MIN bytes in all: its placeholder (its place in the slot still 0)."""
    first = x[0]
    if type(first) is not np.ndarray or first.ndim == 0 or not tensorable(first):
        return None
    dtype, tail = first.dtype, first.shape[1:]
    rows, nbytes = [], 0
    for a in x:
        if type(a) is not np.ndarray or a.dtype != dtype or a.shape[1:] != tail:
            return None
        rows.append(a.shape[0])
        nbytes += a.nbytes
    if nbytes < _ARRAY_MIN:
        return None
    return Ref("arrays", 0, nbytes, dtype.str, tail, rows)


def _place(ref: Ref, value: Any, found: list[tuple[Ref, Any]], end: list[int]) -> Ref:
    ref.offset = HEAD + end[0]
    ref.index = len(found)
    end[0] += (ref.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    found.append((ref, value))
    return ref


def write(view: np.ndarray, ref: Ref, value: Any) -> None:
    dst = view[ref.offset : ref.offset + ref.nbytes]
    if ref.kind == "array":
        np.copyto(dst.view(value.dtype).reshape(value.shape), value)
    elif ref.kind == "arrays":  # one copy of them all, in C
        shape = (sum(ref.rows or ()), *ref.shape)
        np.concatenate(value, out=dst.view(ref.dtype).reshape(shape))
    elif ref.kind == "tensor":
        torch.from_numpy(dst).copy_(value.contiguous().reshape(-1).view(torch.uint8))
    else:
        join_bytes(dst, value, ref.dtype)
