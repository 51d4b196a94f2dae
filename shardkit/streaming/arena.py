"""Per-worker shared-memory arenas: how a worker process's batches reach the training
process without a fresh shared segment, or a pipe full of bytes, per batch.

Each worker process owns up to :data:`SLOTS` slots, each a shared-memory segment made once
and reused. A batch's arrays, CPU tensors, lists of arrays of one dtype (one buffer and the
arrays' lengths: a batch of variable-length token arrays is one copy in the worker and one
split in C in the training process) and big lists of bytes are copied into a free slot;
what crosses the worker's pipe is a :class:`Parcel`: the batch's structure with references
into the slot (and, until the training process has it, the segment itself). The training
process opens it into what :func:`~shardkit.streaming.transfer.deliver` gives every mode.

Reuse must never overwrite a batch the training process still reads, so a slot is free
only when the training process has *released* it, through a control block it made and
shares with the workers (:class:`Lanes`):

- without pinning, a batch arrives as views into the slot (no copy); the slot is released
  when the last view is gone (the views keep a holder object alive; its finalizer
  releases). A training loop that keeps many batches alive uses more slots, then fresh
  segments; never a slot still in use;
- with pinning (the DataLoader's pin thread calls :meth:`Parcel.pin_memory`), a batch is
  copied once into pinned memory (torch's caching host allocator reuses the pinned
  blocks) and the slot released at once.

A release names the slot's generation and the batch's sequence number in one 64-bit word,
so a release from an earlier worker process, or an earlier use of the slot, never frees
it. On arrival the slot's header must carry the parcel's sequence number and the segment
the parcel's generation; anything else is a :class:`~shardkit.errors.TransferError`.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import torch

from shardkit.errors import TransferError
from shardkit.streaming.shared import shared_bytes
from shardkit.streaming.slot_layout import HEAD, Ref, SlotLayout, write
from shardkit.streaming.transfer import (
    InlineBatch,
    PackedBytes,
    Pickled,
    can_pin,
    deliver,
)

__all__ = [
    "Held",
    "Lanes",
    "Parcel",
    "SLOTS",
    "WorkerArena",
    "open_parcel",
    "take_over",
]

SLOTS = 16  # slots per worker; a worker uses about prefetch_factor + 2 of them
_MIN_SEGMENT = 1 << 20
_MASK = (1 << 63) - 1
_RELEASED, _KNOWN = 0, 1  # the control block's two words per slot
# a worker's first batch up to this size is pickled through the pipe: a slot's first
# segment costs its making and its file descriptor's passing to the training process,
# more than a small batch through the pipe; a big batch crosses the pipe slower than that
INLINE_FIRST = 1 << 20


def _word(gen: int, seq: int) -> int:
    return (gen + seq) & _MASK


class Lanes:
    """The control block of one loader's workers: per worker and slot, the word of the
    last released batch and the generation of the segment the training process holds.
    Made in the training process; workers get it with the data set (pickled or forked)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(workers, 1)
        words = self.workers * SLOTS * 2  # zero-filled, as the Mailbox's buffer
        self.ctl = shared_bytes(words * 8).view(torch.int64).reshape(self.workers, SLOTS, 2)
        self.token = _random63()
        _LANES[self.token] = self
        weakref.finalize(self, _forget, self.token)


def _random63() -> int:
    return int.from_bytes(os.urandom(8), "little") & _MASK


def _forget(token: int) -> None:
    """A loader is gone: let go of its workers' segments."""
    with _LOCK:
        for key in [k for k in _SEGMENTS if k[0] == token]:
            del _SEGMENTS[key]


_LANES: weakref.WeakValueDictionary[int, Lanes] = weakref.WeakValueDictionary()
# the training process's segments: (token, worker, slot) -> (generation, its bytes, the
# slot's two control words)
_SEGMENTS: dict[tuple[int, int, int], tuple[int, np.ndarray, np.ndarray]] = {}
_LOCK = threading.RLock()  # the main thread and the pin thread open parcels
SEGMENTS_RECEIVED = 0  # segments this process was sent (how well slots are reused)


@dataclass
class Parcel:
    """A batch as it crosses from a worker: its structure, references into a slot, and the
    slot's segment while the training process may not have it yet."""

    token: int
    worker: int
    slot: int
    gen: int
    seq: int
    tree: Any
    segment: torch.Tensor | None

    def pin_memory(self, device: Any = None) -> Any:
        """Called by the DataLoader's pin thread: the batch copied into pinned memory, the
        slot released at once."""
        return open_parcel(self, pin=True)


class _Slot:
    def __init__(self, nbytes: int) -> None:
        self.tensor = shared_bytes(nbytes)
        self.view = self.tensor.numpy()
        self.gen = _random63()
        self.seq = 0
        self.used = 0  # when it was last written (the arena's batch count)


class WorkerArena:
    """A worker process's slots; :meth:`pack` turns a batch into a :class:`Parcel`."""

    def __init__(self, lanes: Lanes, worker: int) -> None:
        if not 0 <= worker < lanes.workers:
            raise TransferError(f"worker {worker} of a loader made for {lanes.workers}")
        self.lanes = lanes
        self.worker = worker
        self.ctl = lanes.ctl[worker].numpy()
        self.slots: list[_Slot | None] = [None] * SLOTS
        self.batches = 0
        self.plain = True  # the last packed batch holds only plain data (see crossing)

    def pack(self, tree: Any) -> Any:
        """The batch as a parcel; as it is (C-ordered where pickle needs it) when nothing in
        it is worth a slot."""
        layout = SlotLayout()
        skeleton = layout.skeleton(tree)
        found = layout.found
        self.plain = layout.plain
        if not found:
            return skeleton
        if (
            self.batches == 0
            and layout.end <= INLINE_FIRST
            and all(r.kind != "tensor" for r, _ in found)
        ):
            self.batches = 1  # the first batch crosses the pipe whole (see INLINE_FIRST)
            return InlineBatch(skeleton, [v for _, v in found], Ref)
        index, slot = self._free_slot(layout.end)
        slot.seq += 1
        slot.used = self.batches = self.batches + 1
        view = slot.view
        for ref, value in found:
            write(view, ref, value)
        view[:8] = np.frombuffer(slot.seq.to_bytes(8, "little"), dtype=np.uint8)
        known = int(self.ctl[index, _KNOWN]) == slot.gen
        self.plain = self.plain and known  # a new segment crosses by torch's sharing
        return Parcel(
            self.lanes.token,
            self.worker,
            index,
            slot.gen,
            slot.seq,
            skeleton,
            None if known else slot.tensor,
        )

    def crossing(self, tree: Any) -> Pickled:
        """The batch packed and pickled as it crosses the worker's queue: by plain pickle
        when it holds only plain data and references into a slot the training process has
        (torch's sharing pickler costs 2-3x more on a batch of 32 json records), else by
        torch's."""
        packed = self.pack(tree)
        return Pickled(packed, self.worker, plain=self.plain)

    def _free_slot(self, nbytes: int) -> tuple[int, _Slot]:
        """A released slot big enough (a released one too small is replaced); a new slot
        while fewer than SLOTS exist; else the least recently written slot gets a new
        segment (its batch may still be in use: its old segment is left to it)."""
        need = nbytes + HEAD
        unused = None
        for i, slot in enumerate(self.slots):
            if slot is None:
                unused = i if unused is None else unused
            elif int(self.ctl[i, _RELEASED]) == _word(slot.gen, slot.seq):
                if len(slot.view) >= need:
                    return i, slot
                return i, self._new(i, need)
        if unused is not None:
            return unused, self._new(unused, need)
        oldest = min(range(SLOTS), key=lambda i: self.slots[i].used)  # type: ignore[union-attr]
        return oldest, self._new(oldest, need)

    def _new(self, index: int, need: int) -> _Slot:
        size = max(_MIN_SEGMENT, need + need // 4)
        slot = _Slot((size + 4095) // 4096 * 4096)
        self.slots[index] = slot
        return slot


# -- the training process --------------------------------------------------------------
class _Hold:
    """Kept alive by every view of one parcel; its finalizer releases the slot."""

    __slots__ = ("__weakref__",)


class Held(np.ndarray):
    """A view into a slot that keeps its parcel's :class:`_Hold` alive."""

    hold: _Hold


def take_over(batch: Any) -> tuple[Any, float]:
    """A batch from a worker process as the training loop gets it (unpickled, a parcel
    opened, small arrays made tensors: :func:`deliver`) and the seconds that took."""
    t = perf_counter()
    if type(batch) is Pickled:
        batch = batch.load()
    if type(batch) is InlineBatch:
        out = batch.open()
    elif type(batch) is Parcel:
        out = open_parcel(batch)
    else:  # nothing worth a slot, or pinned already by the pin thread
        out = deliver(batch)
    return out, perf_counter() - t


def open_parcel(parcel: Parcel, pin: bool = False) -> Any:
    """The batch of a parcel, in the training process: views into the slot (released when
    the last is gone) or, with ``pin``, pinned copies (released at once)."""
    key = (parcel.token, parcel.worker, parcel.slot)
    with _LOCK:
        if parcel.segment is not None:
            _register(key, parcel)
        gen, view, ctl = _SEGMENTS.get(key, _NONE)
    if gen != parcel.gen:
        raise TransferError(f"{_where(parcel)}: its shared segment never arrived")
    if int.from_bytes(view[:8].tobytes(), "little") != parcel.seq:
        raise TransferError(f"{_where(parcel)}: the slot holds another batch")
    word = _word(parcel.gen, parcel.seq)
    if pin:  # copies (pinned where this process can pin)
        out = _build(parcel.tree, view, None, can_pin())
        ctl[_RELEASED] = word
        return out
    hold = _Hold()
    weakref.finalize(hold, ctl.__setitem__, _RELEASED, word)
    return _build(parcel.tree, view, hold, False)


_NONE: tuple[Any, Any, Any] = (None, None, None)


def _where(parcel: Parcel) -> str:
    return f"worker {parcel.worker}'s batch {parcel.seq} (slot {parcel.slot})"


def _register(key: tuple[int, int, int], parcel: Parcel) -> None:
    """A slot's (new) segment arrived: keep it, and tell the worker it need not send it."""
    lanes = _LANES.get(parcel.token)
    if lanes is None or parcel.segment is None:
        raise TransferError(f"a batch from worker {parcel.worker} of a loader that is gone")
    global SEGMENTS_RECEIVED
    ctl = lanes.ctl[parcel.worker, parcel.slot].numpy()
    _SEGMENTS[key] = (parcel.gen, parcel.segment.numpy(), ctl)
    ctl[_KNOWN] = parcel.gen
    SEGMENTS_RECEIVED += 1


def _build(x: Any, view: np.ndarray, hold: _Hold | None, pin: bool) -> Any:
    """The batch of a parcel's skeleton: placeholders opened into the slot's bytes (views
    that keep ``hold`` alive, or pinned copies when ``hold`` is None), the rest delivered."""

    def opened(ref: Ref) -> Any:
        return _materialize(ref, view, hold, pin)

    return deliver(x, pin, (Ref, opened))


def _materialize(ref: Ref, view: np.ndarray, hold: _Hold | None, pin: bool) -> Any:
    raw = view[ref.offset : ref.offset + ref.nbytes]
    if hold is None:  # a (pinned) copy
        flat = torch.empty(ref.nbytes, dtype=torch.uint8, pin_memory=pin)
        flat.copy_(torch.from_numpy(raw))
    else:  # a view of the held view keeps it, and the hold, alive
        held = raw.view(Held)
        held.hold = hold
        flat = torch.from_numpy(held)
    if ref.kind == "bytes":
        return PackedBytes.over(flat, ref.dtype)
    if ref.kind == "tensor":
        return flat.view(ref.dtype).reshape(ref.shape)
    typed = flat.view(_torch_dtype(ref.dtype))
    if ref.kind == "array":
        return typed.reshape(ref.shape)
    rows = ref.rows or []
    if ref.shape:  # each array has more than one dimension
        typed = typed.view(sum(rows), *ref.shape)
    return list(typed.split_with_sizes(rows))  # torch.split's Python wrapper costs ~15%


_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(code: str) -> torch.dtype:
    """The torch dtype of a numpy dtype string (``"<i4"``)."""
    if code not in _DTYPES:
        _DTYPES[code] = torch.from_numpy(np.empty(0, dtype=code)).dtype
    return _DTYPES[code]
