"""A batch moved to a device with one copy per list of arrays, not one per tensor.

A batch from :class:`~shardkit.streaming.loader.WebLoader` holds lists of tensors that are
consecutive views of one buffer: a batch of 32 variable-length token arrays crosses from a
worker as one buffer split into 32 views (pinned, with ``pin_memory=True``).
``tensor.to("cuda", non_blocking=True)`` on each view pays a copy's fixed cost (a few us of
Python and driver work each) 32 times, where the bytes of a batch of documents take a few
us in all. :func:`to_device` copies such a list's buffer once and splits it on the device
(one call in C), so the training loop gets the same list of tensors there.

A list whose tensors are not one run of a buffer (made one by one, other dtypes or
trailing shapes, strided, needing grad) moves tensor by tensor, as ``.to`` moves it.
"""

from __future__ import annotations

import copy as _copy
from typing import Any

import torch

from shardkit.streaming.transfer import WALK, walk

__all__ = ["to_device"]


def to_device(
    batch: Any, device: str | torch.device, non_blocking: bool = True, copy: bool = False
) -> Any:
    """``batch`` (dicts, lists and tuples; namedtuples and dict subclasses keep their
    type) with every tensor on ``device`` (``non_blocking`` from pinned memory): a list of
    consecutive views of one buffer in one copy, split there; other tensors each by
    ``.to``; other values as they are.

    ``copy``: copy even tensors already on ``device`` (as ``Tensor.to(copy=True)``)."""
    dev = torch.device(device)

    def leaf(x: Any) -> Any:
        if type(x) is list:
            moved = _run_moved(x, dev, non_blocking, copy)
            return WALK if moved is None else moved
        if isinstance(x, torch.Tensor):
            return x.to(dev, non_blocking=non_blocking, copy=copy)
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a collate's namedtuple
            return type(x)(*(walk(v, leaf) for v in x))
        if isinstance(x, dict):  # OrderedDict, defaultdict: a copy keeps what it holds
            out = _copy.copy(x)
            for k, v in x.items():
                out[k] = walk(v, leaf)
            return out
        return x

    return walk(batch, leaf)


def _run_moved(
    x: list[Any], dev: torch.device, non_blocking: bool, copy: bool
) -> list[torch.Tensor] | None:
    """The list ``x`` on ``dev`` where it is what ``split_with_sizes`` of one contiguous
    run of a buffer makes (one dtype and trailing shape, each tensor starting where the one
    before ends), in one copy; else None."""
    first = x[0]
    if type(first) is not torch.Tensor or len(x) < 2 or not _dense(first) or first.dim() == 0:
        return None
    if first.device == dev and not copy:
        return None
    dtype, nd, tail, at = first.dtype, first.dim(), first.shape[1:], first.data_ptr()
    rows = []
    try:
        for t in x:
            if type(t) is not torch.Tensor or t.dtype is not dtype or t.is_conj() or t.is_neg():
                return None  # a conjugate or negative view's values are not its bytes
            if t.data_ptr() != at and t.numel():  # an empty view's pointer may be anything
                return None
            shape = t.shape
            if len(shape) != nd or shape[1:] != tail or not t.is_contiguous() or t.requires_grad:
                return None
            rows.append(shape[0])
            at += t.nbytes
    except RuntimeError:  # a sparse, mkldnn or nested one (of the first's dtype) has neither
        return None  # a data pointer nor sizes: checked so, not by ~0.2 us of flags a tensor
    storage, start = first.untyped_storage(), first.storage_offset() * first.element_size()
    if start + (at - first.data_ptr()) > storage.nbytes():
        return None  # tensors of other buffers that happen to follow it in memory
    run = torch.empty(0, dtype=dtype, device=first.device)
    size, step = (sum(rows), *tail), 1
    stride: list[int] = []
    for n in reversed(size):  # C order
        stride.insert(0, step)
        step *= max(n, 1)
    run.set_(storage, first.storage_offset(), size, stride)
    return list(run.to(dev, non_blocking=non_blocking, copy=True).split_with_sizes(rows))


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is a plain dense tensor (strided, not quantized, not nested), whose
    values a raw copy of its buffer keeps but for a conjugate or negative bit."""
    return t.layout is torch.strided and not (t.is_quantized or t.is_nested)
