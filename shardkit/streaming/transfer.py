"""How batches cross from DataLoader workers to the training process.

Batches arrive with numpy arrays as tensors. From worker processes, arrays, tensors and big
lists of bytes (a :class:`PackedBytes`) cross in a per-worker shared-memory arena reused
from batch to batch (:mod:`shardkit.streaming.arena`); the rest pickles through the
worker's pipe. What to iterate and from where goes the other way, from the loader to its
workers, through a :class:`Mailbox`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch

from shardkit.errors import StateDictError

__all__ = [
    "InlineBatch",
    "InlineBytes",
    "Mailbox",
    "PackedBytes",
    "arrived",
    "can_pin",
    "shared_bytes",
    "tensorable",
    "to_torch",
]

_MAILBOX = 1 << 18


class Mailbox:
    """JSON from the loader to its workers through a shared uint8 tensor."""

    def __init__(self, capacity: int = _MAILBOX) -> None:
        self.buf = torch.zeros(capacity + 8, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]

    def write(self, obj: Mapping[str, Any]) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if len(data) > len(self.buf) - 8:
            raise StateDictError(f"loader: the resume state is too large ({len(data)} bytes)")
        view = self.buf.numpy()
        view[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        view[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)

    def read(self) -> dict[str, Any]:
        view = self.buf.numpy()
        n = int.from_bytes(view[:8].tobytes(), "little")
        out: dict[str, Any] = json.loads(view[8 : 8 + n].tobytes())
        return out


_NESTED = (np.ndarray, dict, tuple, list)


def tensorable(x: np.ndarray) -> bool:
    """An array torch can take over: numbers in this machine's byte order (a big-endian
    array, strings, objects stay numpy)."""
    return x.dtype.kind in "biufc" and x.dtype.isnative


def shared_bytes(n: int) -> torch.Tensor:
    """A uint8 tensor made in shared memory (``share_memory_()`` would allocate, then copy)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # pragma: no cover - older or newer torch
        fallback: torch.Tensor = torch.empty(n, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
        return fallback
    out: torch.Tensor = torch.empty(0, dtype=torch.uint8).set_(new_shared(n))
    return out


class PackedBytes(Sequence[bytes]):
    """A batch's list of ``bytes`` as it arrives from a worker: one shared-memory tensor.

    A read-only sequence: ``len``, indexing and iteration give ``bytes`` (copied out on
    access); :attr:`tensor` and :attr:`offsets` give zero-copy access to all of it.
    """

    def __init__(self, items: list[bytes]) -> None:
        ends = np.cumsum([len(b) for b in items])
        self.tensor = shared_bytes(int(ends[-1]))
        view = self.tensor.numpy()
        start = 0
        for b, end in zip(items, ends.tolist(), strict=True):
            view[start:end] = np.frombuffer(b, dtype=np.uint8)
            start = end
        self.offsets: list[int] = [0, *ends.tolist()]

    @classmethod
    def over(cls, tensor: torch.Tensor, offsets: list[int]) -> PackedBytes:
        """The items at ``offsets`` of a uint8 tensor (no copy)."""
        out = cls.__new__(cls)
        out.tensor = tensor
        out.offsets = offsets
        return out

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
        return self.tensor.numpy()[self.offsets[i] : self.offsets[i + 1]].tobytes()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedBytes({len(self)} items, {self.offsets[-1]} bytes)"


class InlineBytes:
    """A list of ``bytes`` joined, as it crosses a worker's pipe (pickled, no shared
    memory): it arrives as the :class:`PackedBytes` a slot would give (:func:`arrived`)."""

    __slots__ = ("data", "offsets")

    def __init__(self, items: list[bytes], offsets: list[int]) -> None:
        self.data = np.frombuffer(b"".join(items), dtype=np.uint8)
        self.offsets = offsets


@dataclass
class InlineBatch:
    """A worker's first batch as it crosses the pipe whole (numpy arrays, InlineBytes; see
    :data:`shardkit.streaming.arena.INLINE_FIRST`): it arrives as a slot's batch would,
    pinned too when the DataLoader pins."""

    tree: Any

    def pin_memory(self, device: Any = None) -> Any:
        """Called by the DataLoader's pin thread: the batch with pinned tensors."""
        return arrived(self.tree, pin=can_pin())


def can_pin() -> bool:
    """Whether this process can pin memory (a CUDA device is there)."""
    return torch.cuda.is_available()


def to_torch(x: Any) -> Any:
    """Numpy arrays (of numbers) become tensors, in dicts, tuples and lists of them."""
    t = type(x)
    if t is np.ndarray:
        if not tensorable(x):
            return x
        return torch.from_numpy(x if x.flags.writeable else x.copy())
    if t is dict:
        return {k: to_torch(v) for k, v in x.items()}
    if t is tuple:
        return tuple(to_torch(v) for v in x)
    if t is list and x and isinstance(x[0], _NESTED):
        return [to_torch(v) for v in x]
    return x  # strings, numbers, lists of bytes go as they are


def arrived(x: Any, pin: bool = False) -> Any:
    """In the training process: the small numpy arrays of a worker's batch become tensors
    (and a worker's first batch's :class:`InlineBytes` a :class:`PackedBytes`); ``pin``:
    those made here are copied into pinned memory."""
    t = type(x)
    if t is np.ndarray:
        if not tensorable(x):
            return x
        out = torch.from_numpy(x)
        return out.pin_memory() if pin else out
    if t is InlineBytes:
        data = torch.from_numpy(x.data if x.data.flags.writeable else x.data.copy())
        return PackedBytes.over(data.pin_memory() if pin else data, x.offsets)
    if t is dict:
        return {k: arrived(v, pin) for k, v in x.items()}
    if t is tuple:
        return tuple(arrived(v, pin) for v in x)
    if t is list and x and isinstance(x[0], _NESTED):
        return [arrived(v, pin) for v in x]
    return x
