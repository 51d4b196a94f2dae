"""Where a batch's values go in a worker's shared-memory slot
(:mod:`shardkit.streaming.arena`): a :class:`SlotLayout` replaces what is worth a slot (big
arrays, CPU tensors, lists of arrays of one dtype, lists of bytes) with :class:`Ref`
placeholders laid out after the slot's header, and :func:`write` copies each value to its
place.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.errors import TransferError
from shardkit.streaming.transfer import (
    WALK,
    bytes_offsets,
    c_order,
    join_bytes,
    tensorable,
    walk,
)

__all__ = ["HEAD", "Ref", "SlotLayout", "write"]

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


class SlotLayout:
    """What of one batch goes into a slot: its values in :attr:`found` (each with its
    :class:`Ref`, laid out after the slot's header), :attr:`end` bytes of them, and whether
    what stays in the structure is plain data (:attr:`plain`: strings, bytes, numbers, None,
    numpy arrays), which plain pickle carries as torch's sharing pickler would."""

    def __init__(self) -> None:
        self.found: list[tuple[Ref, Any]] = []
        self.end = 0
        self.plain = True

    def skeleton(self, x: Any) -> Any:
        """``x`` with what goes into the slot replaced by :class:`Ref` placeholders (the
        containers :func:`~shardkit.streaming.transfer.deliver` walks, and only those)."""
        return walk(x, self._leaf)

    def _leaf(self, x: Any) -> Any:
        t = type(x)
        if t is np.ndarray:
            if not tensorable(x):  # C order before pickle: it drops a strided array's byte order
                return c_order(x)
            if x.nbytes < _ARRAY_MIN:
                return x
            return self._place(Ref("array", 0, x.nbytes, x.dtype.str, x.shape), x)
        if t is torch.Tensor:
            if x.is_conj() or x.is_neg():  # torch's sharing drops these bits: wrong values
                x = _resolved(x)
            placed = x.device.type == "cpu" and x.layout == torch.strided and not x.is_quantized
            if not placed or x.requires_grad or x.nbytes < _ARRAY_MIN:
                self.plain = False
                return x
            return self._place(Ref("tensor", 0, x.nbytes, x.dtype, tuple(x.shape)), x)
        if t is list:
            offsets = bytes_offsets(x)
            if offsets is not None:
                return self._place(Ref("bytes", 0, offsets[-1], offsets), x)
            ref = _arrays(x)
            return WALK if ref is None else self._place(ref, x)
        if t not in _PLAIN:  # any other object may hold a tensor, or pickle otherwise
            self.plain = False
        return x

    def _place(self, ref: Ref, value: Any) -> Ref:
        ref.offset = HEAD + self.end
        ref.index = len(self.found)
        self.end += (ref.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.found.append((ref, value))
        return ref


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
    at least _ARRAY_MIN bytes in all: its placeholder (its place in the slot still 0). The
    checks run over the list in C (map, sets), not an item at a time in Python."""
    first = x[0]
    if type(first) is not np.ndarray or first.ndim == 0 or not tensorable(first):
        return None
    if not _ONLY_ARRAYS.issuperset(map(type, x)) or len(set(map(_dtype, x))) != 1:
        return None
    shapes = list(map(_shape, x))
    tail = first.shape[1:]
    if ({s[1:] for s in shapes} != {tail}) if tail else (set(map(len, shapes)) != {1}):
        return None
    rows = [s[0] for s in shapes]
    nbytes = sum(rows) * first.itemsize * math.prod(tail)
    if nbytes < _ARRAY_MIN:
        return None
    return Ref("arrays", 0, nbytes, first.dtype.str, tail, rows)


_ONLY_ARRAYS = frozenset({np.ndarray})
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})
_dtype = operator.attrgetter("dtype")
_shape = operator.attrgetter("shape")


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
