"""Bundles: several of a worker process's batches crossing to the training process as one
DataLoader item.

Every DataLoader item costs the training process a fixed price whatever it holds (a queue
round-trip and its poll, two unpickles, a parcel opened, torch's per-item profiler hooks):
on LLM documents (32 small token arrays a batch) that price was as much as the batch's
data. So a worker process groups its batches into bundles: ``k`` batches packed into one
parcel (one slot, one pickle), each with its own meta (its worker's cursor after it), and
the training process opens a bundle once and hands its batches out one at a time.

``k`` follows one schedule in every worker: 1 for an epoch's first item (the first batch is
no later), then 2, 4, ... up to a cap the training process sets for the epoch (through the
mailbox: from the bytes an earlier epoch's batches held, else at most
:data:`BUNDLE_GUESSED`, see :func:`bundle_cap`) and, once it has seen every worker's first
bundle, publishes for the bundles after those any worker may have been asked for
(:class:`~shardkit.streaming.shared.CapBoard`), so a worker's ``j``-th item holds the same
batches of its stream in every worker and the bundles in flight stay near
:data:`BUNDLE_BYTES` of what the batches really hold (a decoded batch can be many times
its bytes in the shards). That is what lets
:class:`Unbundled` hand the batches out in the order of thread workers (round-robin over
the workers still going, a batch at a time), from the DataLoader's order (round-robin a
bundle at a time), holding at most one bundle per worker: a worker ended when the item
after its bundle is another worker's (its next one would have come first) or the
DataLoader ends. State and resume are per batch as before, mid-bundle too.

A worker's error while it makes a bundle's batch ends the bundle there: the batches made
before it cross, and the error is raised at the worker's next item, so the training loop
gets every batch before it, then the error, as with threads. A batch that cannot be pickled
cuts its bundle the same way (the worker's :class:`~shardkit.streaming.workers.Packer`).
Such a bundle is marked ``failing``: its worker has not ended, though the DataLoader's next
item (another worker's, due first) says so by the rule above, so :class:`Unbundled` reads on
to the worker's error item.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import torch

from shardkit.streaming.arena import Parcel, open_parcel
from shardkit.streaming.shared import CapBoard
from shardkit.streaming.transfer import InlineBatch, PackedBytes, Pickled, can_pin, deliver

__all__ = [
    "BUNDLE_BYTES",
    "BUNDLE_GUESSED",
    "BUNDLE_MAX",
    "Bundle",
    "Packed",
    "Unbundled",
    "batch_bytes",
    "bundle_cap",
    "bundles",
]

BUNDLE_MAX = 16  # batches a bundle holds at most
# estimated bytes of all the bundles a loader's workers may hold in shared memory at once
# (each worker's prefetched ones and the one being handed out): under a container's
# default /dev/shm of 64 MB with room to spare, whatever the worker count
BUNDLE_BYTES = 32 << 20
_END = object()

Meta = dict[str, Any]


BUNDLE_GUESSED = 2  # the cap while a batch's bytes are only guessed from the manifest


def bundle_cap(item_bytes: float | None, in_flight: int, seen: float | None = None) -> int:
    """The most batches a bundle holds when ``in_flight`` bundles may be held at once (see
    :data:`BUNDLE_BYTES`) and a batch is ``seen`` bytes (the most the first batches
    held) or, not seen yet, guessed at ``item_bytes`` (the manifest's bytes an
    item; None: not known, 2). A guess is capped at :data:`BUNDLE_GUESSED`: what a worker
    hands over is the decoded batch, which may be many times its bytes in the shards
    (JPEG to pixels): a guessed cap of 16 held 15x the shared memory of one batch an item."""
    if seen is None and item_bytes is None:
        return 2
    per_bundle = BUNDLE_BYTES / max(in_flight, 1)
    most = BUNDLE_MAX if seen is not None else BUNDLE_GUESSED
    size = seen if seen is not None else item_bytes
    return max(1, min(most, int(per_bundle // max(size or 1.0, 1.0))))


def batch_bytes(x: Any) -> int:
    """The bytes of a batch's arrays, tensors, byte strings and packed bytes."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return int(x.nbytes)
    if isinstance(x, bytes | str):
        return len(x)
    if type(x) is PackedBytes:
        return x.offsets[-1]
    if isinstance(x, dict):
        return sum(batch_bytes(v) for v in x.values())
    if isinstance(x, list | tuple):
        return sum(batch_bytes(v) for v in x)
    return 0


@dataclass
class Bundle:
    """A worker's bundle before packing: its batches, each one's meta, the worker's id."""

    batches: list[Any]
    metas: list[Meta | None]
    worker: int
    error: Exception | None = None  # raised at the worker's next item, after these batches


def bundles(
    batches: Iterator[tuple[Any, Meta | None]], cap: int, worker: int, board: CapBoard | None = None
) -> Iterator[Bundle]:
    """``batches`` grouped as the schedule says (1, 2, 4, ... up to ``cap``, or the cap
    ``board`` publishes for later bundles); an error making a batch ends its bundle, and is
    raised when the next bundle is asked for."""
    k, index = 1, 0
    while True:
        got: list[Any] = []
        metas: list[Meta | None] = []
        error: Exception | None = None
        try:
            for batch, meta in batches:
                got.append(batch)
                metas.append(meta)
                if len(got) == k:
                    break
        except Exception as exc:  # noqa: BLE001 - raised after the batches before it
            error = exc
        if got:
            bundle = Bundle(got, metas, worker, error)
            yield bundle
            error = bundle.error  # the packer's, where it cut the bundle (see Packer)
        if error is not None:
            raise error
        if len(got) < k:
            return
        index += 1
        k = min(2 * k, cap if board is None else board.cap_at(index, cap))


@dataclass
class Packed:
    """A bundle as it crosses: ``body`` is its batches (a tuple) packed by the worker's
    arena (a :class:`Parcel`, an :class:`InlineBatch`, or the tuple itself)."""

    body: Any
    metas: list[Meta | None]
    worker: int
    failing: bool = False  # the worker's next item is an error

    def open(self, pin: bool = False) -> list[Any]:
        """The batches as the training loop gets them (pinned copies with ``pin``)."""
        body = self.body
        if type(body) is Parcel:
            return list(open_parcel(body, pin=True) if pin else open_parcel(body))
        if type(body) is InlineBatch:
            return list(body.open(pin and can_pin()))
        return list(deliver(body, pin and can_pin()))

    def pin_memory(self, device: Any = None) -> Opened:
        """Called by the DataLoader's pin thread: opened, pinned, the slot released."""
        return Opened(self.open(pin=True), self.metas, self.worker, self.failing)


@dataclass
class Opened:
    """A bundle opened by the pin thread."""

    batches: list[Any]
    metas: list[Meta | None]
    worker: int
    failing: bool = False


class Unbundled:
    """The batches of a DataLoader over bundling worker processes, one at a time, in thread
    workers' order, each as ``(batch, meta)`` (see the module docstring); the training
    process's seconds opening a worker's bundles are added to its meta's ``transfer_s``."""

    def __init__(
        self,
        items: Iterator[Any],
        workers: int,
        seen: list[int] | None = None,
        publish: Callable[[int, int], None] | None = None,
        ahead: int = 0,
    ) -> None:
        self.items = items
        self.queues: list[deque[tuple[Any, Meta | None]]] = [deque() for _ in range(workers)]
        self.going = list(range(workers))
        self.turn = 0
        self.ended = False
        self.opened = [0.0] * workers
        self.failing: set[int] = set()  # workers whose next item is their error
        self.sized = [0] * workers  # bundles of each worker whose batches were measured
        self.seen = [0] if seen is None else seen  # [the most bytes a measured batch held]
        # once every worker's first bundle is measured: publish(index, bytes of a batch),
        # index past any bundle a worker may have been asked for (``ahead``: the most items
        # the DataLoader asks for before it has one back)
        self.publish, self.ahead = publish, ahead
        self.received = [0] * workers

    def __iter__(self) -> Unbundled:
        return self

    def __next__(self) -> tuple[Any, Meta | None]:
        going = self.going
        while going:
            i = self.turn % len(going)
            w = going[i]
            q = self.queues[w]
            if not q and not self._pull(w):
                del going[i]  # the next worker takes this turn (the first after the last)
                self.turn = i
                continue
            self.turn = i + 1
            return q.popleft()
        raise StopIteration

    def _pull(self, w: int) -> bool:
        """Items until worker ``w``'s next bundle is in: False when it has ended."""
        while not self.ended:
            got = next(self.items, _END)  # raises a worker's error, in its turn
            if got is _END:
                self.ended = True
                return False
            opened, took = _opened(got)
            who = opened.worker
            self.opened[who] += took
            spent = self.opened[who]
            for meta in opened.metas:
                if meta is not None:
                    c = meta["c"]
                    c["transfer_s"] = c.get("transfer_s", 0.0) + spent
            self.queues[who].extend(zip(opened.batches, opened.metas, strict=True))
            self.received[who] += 1
            if self.sized[who] < 2:  # a worker's first bundles: what a batch holds
                self.sized[who] += 1
                self.seen[0] = max([self.seen[0], *map(batch_bytes, opened.batches)])
                if self.publish is not None and min(self.sized) == 1 == self.sized[who]:
                    self.publish(max(self.received) + self.ahead + 1, self.seen[0])
            elif opened.batches:  # later bundles: batches may grow; the next epoch's cap
                self.seen[0] = max(self.seen[0], batch_bytes(opened.batches[0]))
            if opened.failing:
                self.failing.add(who)
            if who == w:
                return True
            if w not in self.failing:
                return False  # another worker's bundle first: w's stream has ended
        return False


def _opened(item: Any) -> tuple[Opened, float]:
    """A DataLoader item opened (the pin thread's already is) and the seconds that took."""
    if type(item) is Opened:
        return item, 0.0
    t = perf_counter()
    packed: Packed = item.load() if type(item) is Pickled else item
    out = Opened(packed.open(), packed.metas, packed.worker, packed.failing)
    return out, perf_counter() - t
