"""How batches cross from DataLoader workers to the training process.

**One rule for every worker mode** (0 workers, thread workers, worker processes): a batch is
handed out as :func:`deliver` makes it, so the three give equal batches (values, types,
dtypes, shapes, strides) for any collate output, or the same named error. Through dicts,
tuples and lists (exactly those types, every element): a numpy array of numbers torch holds,
in this machine's byte order, becomes a C-contiguous tensor (copied only when it is not one
or is read-only); other arrays (big-endian, strings, objects, long doubles) stay numpy,
C-contiguous; a CPU tensor arrives C-contiguous with a lazy conjugate or negation resolved
(one that needs grad, sparse, quantized or on a device as it is); a list of ``bytes`` of at
least :data:`BYTES_MIN` in all becomes a :class:`PackedBytes`; anything else (strings,
numbers, None, other objects and what they hold) as it is.

From worker processes, arrays, tensors, lists of same-dtype arrays (one buffer and their
lengths, split in C on arrival) and big lists of bytes cross in a per-worker shared-memory
arena reused from batch to batch (:mod:`shardkit.streaming.arena`); the rest is pickled in the
worker (:class:`Pickled`: a batch pickle cannot carry is a :class:`TransferError` there, not a
worker that never answers). What to iterate and from where goes the other way, from the
loader to its workers, through a :class:`~shardkit.streaming.shared.Mailbox`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from shardkit.errors import TransferError

__all__ = [
    "BYTES_MIN",
    "InlineBatch",
    "PackedBytes",
    "Pickled",
    "WALK",
    "atoms",
    "bytes_offsets",
    "c_order",
    "can_pin",
    "deliver",
    "tensorable",
    "walk",
]

BYTES_MIN = 256 << 10  # a list of bytes at least this big arrives as one PackedBytes


_TENSORABLE: dict[np.dtype[Any], bool] = {}


def tensorable(x: np.ndarray) -> bool:
    """An array torch can take over: numbers of a dtype torch has, in this machine's byte
    order (big-endian arrays, strings, objects, long doubles stay numpy)."""
    dt = x.dtype
    ok = _TENSORABLE.get(dt)
    if ok is None:
        ok = dt.kind in "biufc" and dt.isnative and _torch_has(dt)
        _TENSORABLE[dt] = ok
    return ok


def _torch_has(dt: np.dtype[Any]) -> bool:
    try:
        torch.from_numpy(np.empty(0, dtype=dt))
    except TypeError:
        return False
    return True


def _c_strides(shape: tuple[int, ...], item: int) -> tuple[int, ...]:
    """The strides C order gives ``shape`` (in units of ``item``)."""
    out = []
    for n in reversed(shape):
        out.append(item)
        item *= n
    return tuple(reversed(out))


def _c_layout(x: np.ndarray) -> bool:
    """C-contiguous with C order's strides: numpy calls an array contiguous whatever the
    stride of a dimension of one (or of an empty array), which may be negative or odd."""
    if not x.flags.c_contiguous:
        return False
    if x.size > 1 and 1 not in x.shape:
        return True
    return x.strides == _c_strides(x.shape, x.itemsize)


def c_order(x: np.ndarray) -> np.ndarray:
    """``x`` itself when laid out in C order, else a C-ordered copy (0-d stays 0-d)."""
    return x if _c_layout(x) else _c_copy(x)


def _c_copy(x: np.ndarray) -> np.ndarray:
    """A C-ordered, writeable copy of ``x``. numpy leaves an empty array's strides 0 (astype,
    copies); C order's are what a worker process's pickle gives it, so every mode does."""
    return _empty_c(x) if x.size == 0 else np.array(x, order="C")


def _empty_c(x: np.ndarray) -> np.ndarray:
    """An empty array of ``x``'s shape and dtype with C order's strides, as pickle rebuilds
    one (writeable: no bytes to share)."""
    strides = _c_strides(x.shape, x.itemsize)
    out: np.ndarray = as_strided(np.empty(x.shape, x.dtype), strides=strides)
    return out


def _tensor(x: np.ndarray) -> torch.Tensor:
    """A tensorable array as a C-contiguous tensor: its memory when it can be, else a copy
    (torch cannot hold negative strides, and must not write into a read-only array)."""
    if not (x.flags.writeable and _c_layout(x)):
        x = _c_copy(x)
    return torch.from_numpy(x)


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor as every mode hands it out: C-contiguous (C order's strides), a lazy
    conjugate or negation resolved; one that needs grad, or is sparse, quantized or on a
    device, as it is."""
    if t.requires_grad or t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
        return t
    t = t.resolve_conj().resolve_neg().contiguous()
    if (t.numel() > 1 and 1 not in t.shape) or t.stride() == _c_strides(t.shape, 1):
        return t
    return t.clone(memory_format=torch.contiguous_format)


_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None)})


def atoms(values: Iterable[Any]) -> bool:
    """Whether all ``values`` are strings, bytes, numbers or None: nothing in them to
    deliver (a json column's records, a batch's keys), told in C."""
    return _ATOMS.issuperset(map(type, values))


def bytes_offsets(x: list[Any]) -> list[int] | None:
    """A non-empty list of ``bytes`` of at least :data:`BYTES_MIN` in all: its items'
    offsets in one buffer (``[0, end0, end1, ...]``); else None."""
    if type(x[0]) is not bytes or not all(type(b) is bytes for b in x):
        return None
    ends = np.cumsum([len(b) for b in x]).tolist()
    return [0, *ends] if ends[-1] >= BYTES_MIN else None


class PackedBytes(Sequence[bytes]):
    """A batch's big list of ``bytes`` (see :data:`BYTES_MIN`) as it is handed out: one
    uint8 tensor (from a worker process, in shared memory) and the items' offsets.

    A read-only sequence: ``len``, indexing and iteration give ``bytes`` (copied out on
    access); :attr:`tensor` and :attr:`offsets` give zero-copy access to all of it. Made
    where the batch was (threads, 0 workers), it keeps the items and joins them into
    :attr:`tensor` only when that is asked for.
    """

    def __init__(self, items: list[bytes], offsets: list[int]) -> None:
        self._items: list[bytes] | None = items
        self._tensor: torch.Tensor | None = None
        self.offsets = offsets

    @classmethod
    def over(cls, tensor: torch.Tensor, offsets: list[int]) -> PackedBytes:
        """The items at ``offsets`` of a uint8 tensor (no copy)."""
        out = cls.__new__(cls)
        out._items = None
        out._tensor = tensor
        out.offsets = offsets
        return out

    @property
    def tensor(self) -> torch.Tensor:
        """All the items' bytes, one after another (see :attr:`offsets`)."""
        if self._tensor is None:
            self._tensor = torch.empty(self.offsets[-1], dtype=torch.uint8)
            join_bytes(self._tensor.numpy(), self._items or [], self.offsets)
        return self._tensor

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} of {n} items")
        i %= n
        if self._items is not None:
            return self._items[i]
        return self.tensor.numpy()[self.offsets[i] : self.offsets[i + 1]].tobytes()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedBytes({len(self)} items, {self.offsets[-1]} bytes)"


def join_bytes(dst: np.ndarray, items: list[bytes], offsets: list[int]) -> None:
    """``items`` copied into the uint8 array ``dst`` at ``offsets``."""
    for b, start, stop in zip(items, offsets, offsets[1:], strict=False):
        dst[start:stop] = np.frombuffer(b, dtype=np.uint8)


@dataclass
class InlineBatch:
    """A worker's first batch as it crosses the pipe whole (see
    :data:`shardkit.streaming.arena.INLINE_FIRST`): its structure, with placeholders of type
    ``ref`` (an ``index`` into ``values``) where a slot would hold a value, and those values
    as the worker made them. It arrives as a slot's batch would (:func:`deliver`), pinned
    too when the DataLoader pins."""

    tree: Any
    values: list[Any]
    ref: type

    def open(self, pin: bool = False) -> Any:
        """The batch as the training loop gets it."""

        def value(placeholder: Any) -> Any:
            return deliver(self.values[placeholder.index], pin)

        return deliver(self.tree, pin, (self.ref, value))

    def pin_memory(self, device: Any = None) -> Any:
        """Called by the DataLoader's pin thread: the batch with pinned tensors."""
        return self.open(can_pin())


_UNLOADED = object()


class Pickled:
    """A worker process's batch (or parcel) pickled in the worker: pickle's refusal is a
    :class:`TransferError` there, raised in the training loop as any worker error is (the
    DataLoader's queue pickled it in a background thread, which only printed the error, and
    the training loop waited for the batch forever)."""

    __slots__ = ("data", "obj")

    def __init__(self, obj: Any, worker: int, *, plain: bool = False) -> None:
        from multiprocessing.reduction import ForkingPickler  # torch's reductions, shared memory

        try:
            if plain:  # only plain data: pickle carries it as torch's sharing pickler would
                self.data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
            else:
                self.data = bytes(ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL))
        except Exception as exc:  # pickle raises many kinds; all mean one thing
            raise TransferError(
                f"worker {worker}'s batch cannot cross to the training process: "
                f"{type(exc).__name__}: {exc}; return only picklable values from the "
                "pipeline and collate_fn, or use worker_mode='thread'"
            ) from exc

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        # loaded as it arrives, as torch loads a batch: a segment shared by file descriptor
        # is fetched from its worker, which may exit before the item's turn (a worker whose
        # stream ended, without persistent_workers)
        self.obj = pickle.loads(data)  # noqa: S301 - our own worker's bytes
        self.data = b""  # not held twice

    def load(self) -> Any:
        """The object as it was pickled."""
        obj = getattr(self, "obj", _UNLOADED)
        return pickle.loads(self.data) if obj is _UNLOADED else obj  # noqa: S301 - ours

    def pin_memory(self, device: Any = None) -> Any:
        """Called by the DataLoader's pin thread: loaded, then pinned as its kind pins."""
        obj = self.load()
        pin = getattr(obj, "pin_memory", None)
        if type(obj) is not torch.Tensor and pin is not None:
            return pin()
        return deliver(obj, pin=can_pin())


def can_pin() -> bool:
    """Whether this process can pin memory (a CUDA device is there)."""
    return torch.cuda.is_available()


Refs = tuple[type, Callable[[Any], Any]]
WALK = object()  # a leaf function's answer for a list: walk its items


def walk(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """``x`` rebuilt through the containers every worker mode walks (dicts, tuples and
    non-empty lists, exactly those types, every element), ``leaf`` giving what each other
    value becomes. A list is offered to ``leaf`` whole first; :data:`WALK` has its items
    walked. Strings, bytes, numbers and None in a dict or list are passed on as they are,
    told in C (a json column of 32 records and a batch's keys cost no per-item call)."""
    t = type(x)
    if t is dict:
        if atoms(x.values()):
            return x
        return {k: walk(v, leaf) for k, v in x.items()}
    if t is tuple:
        return tuple(walk(v, leaf) for v in x)
    if t is list:
        if not x:
            return x
        whole = leaf(x)
        if whole is not WALK:
            return whole
        if atoms(x):
            return x
        return [walk(v, leaf) for v in x]
    return leaf(x)


def _pinned_run(x: list[Any], pin: bool = True) -> list[torch.Tensor] | None:
    """A list of two or more tensorable arrays, or plain CPU tensors, of one dtype and
    trailing shape as views of ONE pinned buffer (one block and one copy, not one each), as
    a worker process's parcel arrives and ``to_device`` moves in one copy; else None."""
    first, kind = x[0], type(x[0])
    if len(x) < 2 or kind not in (np.ndarray, torch.Tensor) or first.ndim == 0:
        return None
    dtype, nd, tail = first.dtype, first.ndim, first.shape[1:]
    for a in x:
        if type(a) is not kind or a.dtype != dtype or a.ndim != nd or a.shape[1:] != tail:
            return None
        if not (tensorable(a) if kind is np.ndarray else _plain_cpu(a)):
            return None
    rows = [a.shape[0] for a in x]
    like = first if kind is torch.Tensor else torch.from_numpy(np.empty(0, dtype))
    flat = torch.empty((sum(rows), *tail), dtype=like.dtype, pin_memory=pin)
    if kind is torch.Tensor:
        torch.cat(x, out=flat)
    else:
        np.concatenate(x, axis=0, out=flat.numpy())
    return list(flat.split_with_sizes(rows))


def _plain_cpu(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and not (t.is_quantized or t.is_conj() or t.is_neg())
    )


def deliver(x: Any, pin: bool = False, refs: Refs | None = None) -> Any:
    """``x`` as the training loop gets it in every worker mode (the module docstring's rule).

    ``pin``: tensors made here are copied into pinned memory. ``refs``: a type of
    placeholder and how to open one (a worker process's parcel, into its slot)."""

    def leaf(v: Any) -> Any:
        return _delivered(v, pin, refs)

    return walk(x, leaf)


def _delivered(x: Any, pin: bool, refs: Refs | None) -> Any:
    """What one value of a batch (not a dict or tuple) is handed out as."""
    t = type(x)
    if t is np.ndarray:
        if not tensorable(x):
            return c_order(x)
        out = _tensor(x)
        return out.pin_memory() if pin else out
    if t is torch.Tensor:
        out = _plain_tensor(x)
        return out.pin_memory() if pin and not out.is_pinned() else out
    if t is list:
        offsets = bytes_offsets(x)
        if offsets is not None:
            return PackedBytes(x, offsets)
        joined = _pinned_run(x) if pin else None
        return WALK if joined is None else joined
    if refs is not None and t is refs[0]:
        return refs[1](x)
    return x
