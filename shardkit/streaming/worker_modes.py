"""The workers of a :class:`~shardkit.WebLoader`: DataLoader worker processes, or threads
(``worker_mode="thread"``), made and stopped here.

``num_workers`` threads of the training process play the DataLoader's worker processes:
each iterates the data set as the logical worker it plays, batches and collates, and the
batches are handed out in the DataLoader's order (round-robin over the workers, an
exhausted worker skipped), so state, exact resume and the DDP contract are the same as
with processes. Nothing is pickled and no batch crosses a process: arrays and bytes stay
where the worker made them. It pays where the pipeline's work releases the GIL (reading,
verification, image and numpy decoding); pure-Python work shares one interpreter.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardkit.errors import ConfigError, FetchError
from shardkit.streaming.arena import Lanes
from shardkit.streaming.transfer import can_pin, deliver
from shardkit.streaming.workers import Batching, Collate, Packer, WorkerSide, exit_is_an_error

__all__ = ["WORKER_MODES", "ThreadWorkers", "close_at_exit", "make_workers", "stop_workers"]

WORKER_MODES = ("process", "thread")
_REFUSED = ("sampler", "batch_sampler", "shuffle", "in_order")  # the plan orders samples
# DataLoader options that have a meaning for threads; the others concern processes
_THREAD_OPTIONS = frozenset(
    {"pin_memory", "pin_memory_device", "prefetch_factor", "timeout", "worker_init_fn"}
)
_IGNORED = frozenset({"persistent_workers", "multiprocessing_context"})
_POLL = 0.1  # seconds between a blocked worker's looks at the stop flag


def make_workers(
    side: WorkerSide,
    mode: str,
    workers: int,
    batch_size: int | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    drop_last: bool,
    options: dict[str, Any],
) -> Iterable[Any]:
    """What a WebLoader iterates for its ``(batch, meta)`` items: a DataLoader over worker
    processes, or :class:`ThreadWorkers`; a mode or an option that cannot work is refused."""
    if mode not in WORKER_MODES:
        raise ConfigError(f"WebLoader: worker_mode={mode!r}: use one of {WORKER_MODES}")
    if mode == "thread" and workers < 1:
        raise ConfigError("WebLoader: worker_mode='thread' needs num_workers >= 1")
    for key in _REFUSED:
        if key in options:
            raise ConfigError(f"WebLoader: {key}= is not supported (the plan orders samples)")
    if mode == "thread":
        return ThreadWorkers(side, workers, batch_size, collate_fn, drop_last, options)
    collate = Collate(collate_fn, batch_size is not None)
    if workers == 0:
        if options.get("pin_memory") and not options.get("pin_memory_device") and can_pin():
            # pinned as deliver pins (a list of arrays in one block), not torch's tensor by
            # tensor, which also turned a PackedBytes into a list of bytes
            collate.pin, options = True, {**options, "pin_memory": False}
        return DataLoader(
            side, batch_size=batch_size, collate_fn=collate, drop_last=drop_last, **options
        )
    # worker processes batch and bundle their batches themselves (shardkit.streaming.bundles)
    side.batching = Batching(batch_size, drop_last, collate.collated)
    options = {"persistent_workers": True, **options}  # fresh ones re-fault every page
    return DataLoader(
        side, batch_size=None, num_workers=workers, collate_fn=Packer(Lanes(workers)), **options
    )


# epochs under way, closed at interpreter exit while modules are whole: left to the
# collector then, their clean-up (stopping workers) ran with half-torn-down modules and
# printed "Exception ignored" tracebacks after a script that left an epoch early
_LIVE: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()


def close_at_exit(epoch: Generator[Any, None, None]) -> None:
    """Close ``epoch`` (a loader's iteration) at interpreter exit if it is still under way."""
    _LIVE.add(epoch)


@atexit.register
def _close_live() -> None:
    for gen in list(_LIVE):
        gen.close()


def stop_workers(it: Iterator[Any], loader: Iterable[Any]) -> None:
    """Stop a DataLoader iterator's worker processes now, when an error ends the epoch: the
    traceback keeps the iterator alive until the garbage collector runs, and torch's own
    shutdown then waited 5 s per worker (a worker that had sent its error was never told to
    stop), so a training job that failed on bad data hung on its way out. Persistent
    workers are stopped too, and the next epoch starts fresh ones."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
        if getattr(loader, "_iterator", None) is it:
            loader._iterator = None  # type: ignore[attr-defined]


class _Ended:
    """A worker's end of the epoch, or the error that ended it."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class ThreadWorkers:
    """Batches from ``workers`` threads in a DataLoader's order (see the module docstring).

    Args:
        side: what each worker runs (:class:`WorkerSide`).
        workers: threads (at least 1).
        batch_size: items per batch (None: the data set's items, one at a time).
        collate_fn, drop_last: as for DataLoader.
        options: DataLoader options: ``prefetch_factor`` (batches each worker makes
            ahead, default 2), ``timeout`` (seconds to wait for a batch, 0: no limit),
            ``pin_memory`` (tensors pinned as worker processes' are; ``pin_memory_device``
            is accepted and means nothing, as in torch), ``worker_init_fn`` (called in each
            thread with its worker id); process options are accepted and mean nothing.
    """

    def __init__(
        self,
        side: WorkerSide,
        workers: int,
        batch_size: int | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        drop_last: bool,
        options: dict[str, Any],
    ) -> None:
        unknown = set(options) - _THREAD_OPTIONS - _IGNORED
        if unknown:
            raise ConfigError(
                f"WebLoader(worker_mode='thread'): {', '.join(sorted(unknown))} "
                "not supported with thread workers"
            )
        self.side = side
        self.workers = max(int(workers), 1)
        self.batch_size = batch_size
        self.batching = Batching(batch_size, drop_last, Collate(collate_fn, batch_size is not None))
        self.ahead = max(int(options.get("prefetch_factor") or 2), 1)
        self.timeout = float(options.get("timeout") or 0)
        self.pin = bool(options.get("pin_memory")) and torch.cuda.is_available()
        self.init_fn: Callable[[int], Any] | None = options.get("worker_init_fn")

    def __iter__(self) -> Iterator[Any]:
        stop = threading.Event()
        queues: list[queue.Queue[Any]] = [queue.Queue(self.ahead) for _ in range(self.workers)]
        threads = [
            threading.Thread(
                target=self._work,
                args=(w, queues[w], stop),
                name=f"shardkit-worker-{w}",
                daemon=True,
            )
            for w in range(self.workers)
        ]
        for t in threads:
            t.start()
        return self._handed_out(queues, threads, stop)

    def _handed_out(
        self, queues: list[queue.Queue[Any]], threads: list[threading.Thread], stop: threading.Event
    ) -> Iterator[Any]:
        """Round-robin over the workers still going, as the DataLoader hands out batches."""
        going = list(range(self.workers))
        turn = 0
        try:
            while going:
                w = going[turn % len(going)]
                got = self._take(queues[w], w)
                if isinstance(got, _Ended):
                    if got.error is not None:
                        raise got.error
                    turn %= len(going)
                    del going[turn]
                    continue  # the next worker takes this turn (the first after the last)
                turn = turn % len(going) + 1
                yield (deliver(got[0], pin=True), got[1]) if self.pin else got
        finally:
            stop.set()
            for q in queues:  # wake workers blocked on a full queue
                while not q.empty():
                    q.get_nowait()
            for t in threads:
                t.join(timeout=5 * _POLL)

    def _take(self, q: queue.Queue[Any], w: int) -> Any:
        if not self.timeout:
            return q.get()
        try:
            return q.get(timeout=self.timeout)
        except queue.Empty:
            raise FetchError(
                f"WebLoader: thread worker {w} gave no batch within timeout={self.timeout} s"
            ) from None

    def _work(self, w: int, q: queue.Queue[Any], stop: threading.Event) -> None:
        def put(x: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(x, timeout=_POLL)
                    return True
                except queue.Full:
                    continue
            return False

        items = None
        try:
            if self.init_fn is not None:
                with exit_is_an_error(f"worker_init_fn of thread worker {w}"):
                    self.init_fn(w)
            items = self.side.stream(w, self.workers, own_io=False)
            for batch in self.batching.batches(items):
                if not put(batch):
                    return
            put(_Ended())
        except BaseException as e:  # noqa: BLE001 - handed to the training loop at its turn
            put(_Ended(e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the epoch's end runs in the thread that read it
