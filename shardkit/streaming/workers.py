"""What runs in each DataLoader worker of a :class:`~shardkit.WebLoader`: read the mailbox,
iterate the data set (its one iteration path) as the logical worker it plays, and attach
to the items the cursor after them; collate there, keeping the last item's meta."""

from __future__ import annotations

import itertools
import pickle
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any, cast

import numpy as np
import numpy.random  # here, once: else each worker process imports it as it starts
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from shardkit.counters import add_counts
from shardkit.errors import TransferError
from shardkit.metrics import counter_delta
from shardkit.per_process import PerProcess
from shardkit.plan.order import stream_seed
from shardkit.stages import Context
from shardkit.stages.epoch import Epoch
from shardkit.streaming.arena import Lanes, WorkerArena
from shardkit.streaming.bundles import Packed, bundles
from shardkit.streaming.dataset import ShardDataset
from shardkit.streaming.shared import CapBoard, Mailbox
from shardkit.streaming.transfer import Pickled, deliver

__all__ = ["Batching", "Collate", "Packer", "WorkerSide", "exit_is_an_error"]

_END = object()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))  # user code's global RNG
    # the CPU generator: torch.manual_seed would queue a CUDA seeding too, with a stack
    # trace read from the source files; a worker that uses CUDA keeps torch's seed
    torch.default_generator.manual_seed(seed)


@contextmanager
def exit_is_an_error(who: str) -> Iterator[None]:
    """``sys.exit()`` in user code run by a worker (the pipeline, collate_fn, the init
    function) is an error that reaches the training loop: in a thread it ended the training
    script with status 0 and no message; in a worker process, the worker with no message."""
    try:
        yield
    except SystemExit as exc:
        raise TransferError(
            f"{who} called sys.exit({exc.code!r}) while making a batch: the data pipeline "
            "cannot end the training job; raise an exception to stop it"
        ) from exc


class WorkerSide(IterableDataset[Any]):
    """Runs in each worker: configure from the mailbox, iterate, attach meta to items."""

    def __init__(
        self, dataset: ShardDataset, mailbox: Mailbox, every: int, board: CapBoard | None = None
    ) -> None:
        super().__init__()
        self.dataset = dataset
        self.mailbox = mailbox
        self.board = board  # a bundle cap the training process publishes mid-epoch
        self.every = every
        self.batching: Batching | None = None  # worker processes batch and bundle here

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            return self.stream(0, 1)
        box = self.mailbox.read()
        items = self.stream(info.id, info.num_workers, seed_rngs=True, box=box)
        if self.batching is not None:
            batches = self.batching.batches(items)
            return _primed(bundles(batches, int(box.get("bundle", 1)), info.id, self.board))
        return _primed(items)

    def stream(
        self,
        phys: int,
        n: int,
        *,
        seed_rngs: bool = False,
        own_io: bool = True,
        box: dict[str, Any] | None = None,
    ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        """The items worker ``phys`` of ``n`` yields, each with its meta (or None).

        ``seed_rngs``: seed user code's global RNGs (a worker process's own; never in the
        training process). ``own_io``: the worker has the process's I/O counters to itself
        (a worker process); thread workers share them, so the loader counts I/O instead.
        ``box``: the mailbox as read (else read here).
        """
        box = self.mailbox.read() if box is None else box
        logical = (int(box["rotation"]) + phys) % n
        ctx = Context(int(box["rank"]), int(box["world"]), logical, n, int(box["epoch"]))
        ds = self.dataset
        ds.set_epoch(ctx.epoch)
        states = box["states"]
        mine = None if states is None else states[logical % len(states)]
        if seed_rngs:
            _seed_everything(stream_seed(ds.seed, ctx.epoch, ctx.rank, logical, 0xBEEF))
        io_stats = ds.io_stats if own_io else _no_io
        return self._run(ds.iterate(ctx, mine), logical, io_stats, io_stats())

    def _run(
        self,
        it: Epoch,
        logical: int,
        io_stats: Callable[[], dict[str, float]],
        base_io: dict[str, float],
    ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        busy = 0.0  # seconds in the pipeline: what the worker spent making items
        side = _side_seconds()  # what this thread's Collate spent before this iteration

        def meta() -> dict[str, Any]:
            c = it.counters()
            extra = counter_delta(_side_seconds(), side)  # as of the batch before
            c["worker_s"] = busy + extra["collate_s"]  # a DataLoader-side collate_fn's too
            add_counts(c, extra)
            return {"w": logical, "s": it.state(), "c": c, "io": counter_delta(io_stats(), base_io)}

        every = self.every
        count = 0
        with exit_is_an_error(f"worker {logical}'s pipeline"):
            t = perf_counter()
            item = next(it, _END)
            busy += perf_counter() - t
            while item is not _END:
                count += 1
                m = meta() if count % every == 0 else None  # before the next item is read
                t = perf_counter()
                nxt = next(it, _END)
                busy += perf_counter() - t
                if nxt is _END:  # after the end: what was read past the last item counts
                    m = meta()
                yield item, m
                item = nxt


def _primed(items: Iterator[Any]) -> Iterator[Any]:
    """``items`` with the first taken now. A worker process's DataLoader makes its iterator
    as the worker starts, then waits for the training process to start the other workers
    and send it an index: the first batch is read meanwhile (the piece it lies in read and
    verified, and decoded), not after. An error is raised where it was before, at the first
    item asked for (torch's worker loop does not catch one made with the iterator of a
    later epoch)."""
    try:
        first = next(items)
    except StopIteration:
        return iter(())
    except Exception as exc:  # noqa: BLE001 - raised at the first item, as before
        return _raising(exc)
    return itertools.chain((first,), items)


def _raising(exc: Exception) -> Iterator[Any]:
    raise exc
    yield  # a generator: raises when asked for its first item


def _no_io() -> dict[str, float]:
    return {}


# seconds each worker thread's Collate spent collating (a DataLoader-side collate_fn) and
# packing batches for the training process: reported with the worker's next batch
_side = threading.local()


def _side_seconds() -> dict[str, float]:
    return {
        "collate_s": getattr(_side, "collate_s", 0.0),
        "transfer_s": getattr(_side, "transfer_s", 0.0),
    }


def _count_side(key: str, seconds: float) -> None:
    setattr(_side, key, getattr(_side, key, 0.0) + seconds)


class Collate:
    """Collate where the batch is made and keep the batch's meta (the last item's); the
    batch is delivered there (:func:`~shardkit.streaming.transfer.deliver`: threads, 0
    workers). Worker processes collate with :meth:`collated` and pack with :class:`Packer`."""

    def __init__(
        self, fn: Callable[[list[Any]], Any] | None, batched: bool, pin: bool = False
    ) -> None:
        self.fn = fn or default_collate
        self.batched = batched
        self.pin = pin  # 0 workers: pinned here, a list of arrays as one block

    def collated(self, items: Any) -> tuple[Any, Any]:
        """The batch of ``items`` (or the item itself when not ``batched``) and its meta."""
        if not self.batched:
            return cast(tuple[Any, Any], items)
        t = perf_counter()
        with exit_is_an_error("collate_fn"):
            batch, meta = self.fn([x[0] for x in items]), items[-1][1]
        _count_side("collate_s", perf_counter() - t)
        return batch, meta

    def __call__(self, items: Any) -> tuple[Any, Any]:
        batch, meta = self.collated(items)
        return deliver(batch, self.pin), meta


class Batching:
    """How a worker turns items into batches: ``batch_size`` items a batch (None: an item
    is a batch), the last partial one dropped with ``drop_last``, collated by ``collate``."""

    def __init__(self, batch_size: int | None, drop_last: bool, collate: Callable[[Any], Any]):
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate = collate

    def batches(self, items: Iterator[Any]) -> Iterator[Any]:
        """The batches of ``items``, each as ``collate`` makes it."""
        if self.batch_size is None:
            for item in items:
                yield self.collate(item)
            return
        batch: list[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self.collate(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate(batch)


class Packer:
    """A worker process's bundles packed into its shared-memory arena
    (:mod:`shardkit.streaming.arena`) and pickled as they cross its queue: the DataLoader's
    ``collate_fn`` there. ``lanes``: the loader's worker processes' control block."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self._arena: PerProcess[WorkerArena | None] = PerProcess(self._make_arena)

    def _make_arena(self) -> WorkerArena | None:
        info = get_worker_info()
        return None if info is None else WorkerArena(self.lanes, info.id)

    def __call__(self, bundle: Any) -> Pickled:
        """``bundle`` (a :class:`~shardkit.streaming.bundles.Bundle`) as it crosses."""
        arena = self._arena.get()
        if arena is None:
            raise TransferError("a bundle is packed only in a worker process")
        t = perf_counter()
        try:
            out = self._packed(arena, bundle, len(bundle.batches))
        except TransferError as exc:  # cut the bundle before the batch that cannot cross
            cut = _first_unpicklable(bundle.batches)
            if not cut:
                raise
            out = self._packed(arena, bundle, cut)
            bundle.error = exc  # raised by bundles() at the worker's next item
        _count_side("transfer_s", perf_counter() - t)
        return out

    @staticmethod
    def _packed(arena: WorkerArena, bundle: Any, n: int) -> Pickled:
        """The first ``n`` batches of ``bundle`` packed and pickled (marked failing when
        the bundle is cut: an error follows them)."""
        body = arena.pack(tuple(bundle.batches[:n]))
        failing = n < len(bundle.batches) or bundle.error is not None
        packed = Packed(body, bundle.metas[:n], bundle.worker, failing)
        return Pickled(packed, arena.worker, plain=arena.plain)


def _first_unpicklable(batches: list[Any]) -> int:
    """The index of the first batch pickle refuses (0 where none is found alone)."""
    for i, batch in enumerate(batches):
        try:
            pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - pickle raises many kinds; all mean one thing
            return i
    return 0
