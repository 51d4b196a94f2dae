"""WebLoader: a torch DataLoader over a ShardDataset that knows its length, its state and
how long the training loop waited.

How exact resume works with workers. Each worker is a *logical* worker ``w`` of the plan
and yields ``(item, meta)``: ``meta`` carries its pipeline's state after that item (and
its counters). The DataLoader hands out the workers' batches round-robin, skipping
exhausted workers, so the consumer side knows after every batch each worker's cursor and
whose turn is next: that is the whole state (:meth:`WebLoader.state_dict`). A restart
loads the cursors and rotates the logical workers so that physical worker 0 plays the
one whose turn was next: the remaining batches come in the same order as in the
uninterrupted run. A state saved with another world size or worker count is merged
(:func:`~shardkit.stages.elastic_merge`) and the rest of the epoch re-planned.

What to iterate and from where reaches the workers through a small shared-memory mailbox
written before every ``iter()``, so persistent workers follow ``set_epoch`` and
``load_state_dict`` too. Batches arrive with numpy arrays as tensors. Big arrays and big
lists of bytes (256 KB and up) cross from the workers in shared memory (a tensor, a
:class:`PackedBytes`); smaller ones pickle through the worker's pipe, which costs less
than making a shared segment.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from shardkit.dataset import ShardDataset, state_epoch
from shardkit.errors import ConfigError, StateDictError
from shardkit.metrics import LoaderStats, counter_delta
from shardkit.order import stream_seed
from shardkit.stages import Context, check_state, resume_plan

__all__ = ["PackedBytes", "WebLoader"]

_END = object()
_MAILBOX = 1 << 18
_REFUSED = ("sampler", "batch_sampler", "shuffle", "in_order")


class _Mailbox:
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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))  # user code's global RNG
    torch.manual_seed(seed)


_NESTED = (np.ndarray, dict, tuple, list)
# Below this many bytes, pickling through the worker's pipe beats making a shared-memory
# segment (measured here: ~250 us of CPU per segment, worker and trainer together).
_SHM_MIN = 256 << 10


def _shared_bytes(n: int) -> torch.Tensor:
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
        self.tensor = _shared_bytes(int(ends[-1]))
        view = self.tensor.numpy()
        start = 0
        for b, end in zip(items, ends.tolist(), strict=True):
            view[start:end] = np.frombuffer(b, dtype=np.uint8)
            start = end
        self.offsets: list[int] = [0, *ends.tolist()]

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


def _to_torch(x: Any, in_worker: bool) -> Any:
    """Numpy arrays become tensors; in a worker, big arrays and big lists of bytes go into
    shared memory (a tensor, a :class:`PackedBytes`) and small arrays stay numpy, which
    pickles faster and becomes a tensor on arrival (:func:`_arrived`)."""
    t = type(x)
    if t is np.ndarray:
        if x.dtype.kind not in "biufc" or (in_worker and x.nbytes < _SHM_MIN):
            return x
        return torch.from_numpy(x if x.flags.writeable else x.copy())
    if t is dict:
        return {k: _to_torch(v, in_worker) for k, v in x.items()}
    if t is tuple:
        return tuple(_to_torch(v, in_worker) for v in x)
    if t is list and x:
        if isinstance(x[0], _NESTED):
            return [_to_torch(v, in_worker) for v in x]
        if (
            in_worker
            and type(x[0]) is bytes
            and all(type(b) is bytes for b in x)
            and sum(len(b) for b in x) >= _SHM_MIN
        ):
            return PackedBytes(x)
    return x  # strings, numbers, small lists of bytes go as they are


def _arrived(x: Any) -> Any:
    """In the training process: the small numpy arrays of a worker's batch become tensors."""
    t = type(x)
    if t is np.ndarray:
        return torch.from_numpy(x) if x.dtype.kind in "biufc" else x
    if t is dict:
        return {k: _arrived(v) for k, v in x.items()}
    if t is tuple:
        return tuple(_arrived(v) for v in x)
    if t is list and x and isinstance(x[0], _NESTED):
        return [_arrived(v) for v in x]
    return x


class _WorkerSide(IterableDataset[Any]):
    """Runs in each worker: configure from the mailbox, iterate, attach meta to items."""

    def __init__(self, dataset: ShardDataset, mailbox: _Mailbox, every: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.mailbox = mailbox
        self.every = every

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        info = get_worker_info()
        phys, n = (info.id, info.num_workers) if info is not None else (0, 1)
        box = self.mailbox.read()
        logical = (int(box["rotation"]) + phys) % n
        ds = self.dataset
        ds.set_epoch(int(box["epoch"]))
        ds.configure(Context(int(box["epoch"]), int(box["rank"]), int(box["world"]), logical, n))
        states = box["states"]
        if states is not None:
            ds.pipeline().load_state_dict(states[logical % len(states)])
        if info is not None:  # a worker process: seed user code's RNGs (never the trainer's)
            _seed_everything(stream_seed(ds.seed, box["epoch"], box["rank"], logical, 0xBEEF))
        return self._run(ds, logical, ds.counters(), ds.io_stats())

    def _run(
        self, ds: ShardDataset, logical: int, base: dict[str, float], base_io: dict[str, float]
    ) -> Iterator[tuple[Any, dict[str, Any] | None]]:
        pipeline = ds.pipeline()

        def meta() -> dict[str, Any]:
            return {
                "w": logical,
                "s": pipeline.state_dict(),
                "c": counter_delta(ds.counters(), base),
                "io": counter_delta(ds.io_stats(), base_io),
            }

        it = iter(pipeline)
        every = self.every
        count = 0
        item = next(it, _END)
        while item is not _END:
            count += 1
            m = meta() if count % every == 0 else None  # before the next item is read
            nxt = next(it, _END)
            if m is None and nxt is _END:
                m = meta()
            yield item, m
            item = nxt


class _Collate:
    """Collate in the worker and keep the batch's meta (the last item's)."""

    def __init__(self, fn: Callable[[list[Any]], Any] | None, batched: bool) -> None:
        self.fn = fn or default_collate
        self.batched = batched

    def __call__(self, items: Any) -> tuple[Any, Any]:
        in_worker = get_worker_info() is not None
        if not self.batched:
            item, meta = items
            return _to_torch(item, in_worker), meta
        return _to_torch(self.fn([x[0] for x in items]), in_worker), items[-1][1]


class WebLoader:
    """A ``torch.utils.data.DataLoader`` over a :class:`ShardDataset`, resumable exactly.

    Args:
        dataset: the data set (batch it with ``.batched(n)`` and leave ``batch_size``
            None, or give ``batch_size`` here to batch with ``collate_fn``).
        batch_size: samples per batch collated in the workers (None: the data set's items).
        num_workers, pin_memory, prefetch_factor, persistent_workers,
        multiprocessing_context, collate_fn, drop_last, timeout, worker_init_fn:
            as for DataLoader (``in_order`` is always on: resume relies on it).
        dataloader_kwargs: more DataLoader options.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int | None = None,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        **dataloader_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise ConfigError(f"WebLoader needs a ShardDataset, not {type(dataset).__name__}")
        for key in _REFUSED:
            if key in dataloader_kwargs:
                raise ConfigError(f"WebLoader: {key}= is not supported (the plan orders samples)")
        for source in dataset.sources:
            source.catalog()  # read the manifest once here; workers get it pickled
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self._logical = max(num_workers, 1)
        self._mailbox = _Mailbox()
        side = _WorkerSide(dataset, self._mailbox, batch_size or 1)
        self._loader: DataLoader[Any] = DataLoader(
            side,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=_Collate(collate_fn, batch_size is not None),
            drop_last=drop_last,
            **dataloader_kwargs,
        )
        self._epoch = dataset.epoch
        self._pending: dict[str, Any] | None = None
        self._initial: list[dict[str, Any]] | None = None
        self._states: list[dict[str, Any] | None] = [None] * self._logical
        self._where: tuple[int, int] = (0, 1)
        self._batches = 0
        self._next_worker = 0
        self._stats = LoaderStats()

    # -- epochs and length ---------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next; a loaded state for another epoch is dropped."""
        self.dataset.set_epoch(epoch)
        self._epoch = int(epoch)

    def __len__(self) -> int:
        """Batches this rank gets in a whole epoch."""
        lengths = self.dataset.lengths(self._logical)
        if lengths is None:
            raise TypeError("the length of this loader is not known up front")
        if self.batch_size is None:
            return sum(lengths)
        bs = self.batch_size
        return sum(k // bs if self.drop_last else -(-k // bs) for k in lengths)

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._mailbox.write(self._begin())
        self._stats.start()
        return self._iterate(iter(self._loader))

    def _begin(self) -> dict[str, Any]:
        """Decide how this iteration starts (fresh, exact resume, elastic) for the mailbox."""
        rank, world = self.dataset.world()
        self._where = (rank, world)
        split_world = self.dataset.splits_by_node
        st, self._pending = self._pending, None
        plan = resume_plan(
            st, epoch=self._epoch, workers=self._logical, world=world, split_world=split_world
        )
        self._batches, self._initial = plan.batches, plan.initial
        self._states = [None] * self._logical
        self._next_worker = plan.rotation
        box = {"epoch": self._epoch, "rank": rank, "world": world, "rotation": plan.rotation}
        return {**box, "states": plan.states}

    def _iterate(self, it: Iterator[Any]) -> Iterator[Any]:
        n = self._logical
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch, meta = next(it)
                except StopIteration:
                    return
                if self.num_workers:
                    batch = _arrived(batch)
                wait = time.perf_counter() - t
                w = int(meta["w"])
                self._states[w] = meta["s"]
                self._batches += 1
                self._next_worker = (w + 1) % n
                self._stats.record(wait, w, meta["c"], meta["io"])
                yield batch
        finally:
            self._stats.stop()

    # -- state ---------------------------------------------------------------------
    def _unreported(self, worker: int) -> dict[str, Any]:
        """The state of a worker that has not yet sent a batch: where it started."""
        rank, world = self._where
        ds = copy.deepcopy(self.dataset)
        ds.configure(Context(self._epoch, rank, world, worker, self._logical))
        if self._initial is not None:
            ds.pipeline().load_state_dict(self._initial[worker])
        return ds.pipeline().state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the epoch: a small JSON-safe dict (cursors, not data)."""
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        workers = []
        for w in range(self._logical):
            st = self._states[w]
            if st is None:
                st = self._unreported(w)
            workers.append(st)
        return {
            "stage": "webloader",
            "version": 1,
            "epoch": self._epoch,
            "rank": self._where[0],
            "world": self._where[1],
            "num_workers": self._logical,
            "batches": self._batches,
            "next_worker": self._next_worker,
            "workers": copy.deepcopy(workers),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter()`` (exactly, or elastically re-planned)."""
        keys = ("epoch", "world", "num_workers", "batches", "next_worker", "workers")
        st = check_state(state, "webloader", 1, keys)
        workers = st["workers"]
        if not isinstance(workers, list) or len(workers) != st["num_workers"] or not workers:
            raise StateDictError("webloader: key 'workers' needs one state per worker")
        for source in self.dataset.sources:
            source.catalog()  # loaded once, then copied
        probe = copy.deepcopy(self.dataset)
        for w in workers:  # fail here, not in a worker, when the pipeline does not fit
            if state_epoch(w) != st["epoch"]:
                raise StateDictError("webloader: a worker state is for another epoch")
            probe.pipeline().load_state_dict(w)
        self._pending = copy.deepcopy(st)
        self.set_epoch(int(st["epoch"]))

    # -- stats ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """samples/s, MB/s, mean and p99 wait for a batch, wait fraction, skips, io counters."""
        return self._stats.summary()
