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
(:mod:`shardkit.streaming.resume`) and the rest of the epoch re-planned. Under a process group the
ranks end each epoch together (:mod:`shardkit.streaming.sync`).

What to iterate and from where reaches the workers through a small shared-memory mailbox
written before every ``iter()``, so persistent workers follow ``set_epoch`` and
``load_state_dict`` too; batches come back as :mod:`shardkit.streaming.transfer` says, from
worker processes several to a DataLoader item (:mod:`shardkit.streaming.bundles`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from typing import Any, cast

from shardkit.errors import ConfigError, FetchError
from shardkit.metrics import LoaderStats, counter_delta
from shardkit.read.shards import CompactShards
from shardkit.stages.mixture import find_mix
from shardkit.stages.source import ShardSource
from shardkit.streaming.bundles import Unbundled, bundle_cap
from shardkit.streaming.dataset import ShardDataset
from shardkit.streaming.place import Place
from shardkit.streaming.resume import merge_rank_states
from shardkit.streaming.retired import exposure_of
from shardkit.streaming.shared import CapBoard, Mailbox
from shardkit.streaming.stall import StallWatch
from shardkit.streaming.sync import EpochEnd
from shardkit.streaming.worker_modes import close_at_exit, make_workers, stop_workers
from shardkit.streaming.workers import WorkerSide

__all__ = ["WebLoader"]

log = logging.getLogger(__name__)
_END = object()


def source_bytes(source: ShardSource) -> int:
    """The bytes of a source's shards the manifest gives (0 where it gives none)."""
    shards = source.catalog().shards
    if isinstance(shards, CompactShards):
        return int(shards.compact.sizes.sum())
    return sum(s.ref.size or 0 for s in shards)


class WebLoader:
    """A ``torch.utils.data.DataLoader`` over a :class:`ShardDataset`, resumable exactly.

    Args:
        dataset: the data set (batch it with ``.batched(n)`` and leave ``batch_size``
            None, or give ``batch_size`` here to batch with ``collate_fn``).
        batch_size: samples per batch collated in the workers (None: the data set's items).
        num_workers, pin_memory, prefetch_factor, persistent_workers,
        multiprocessing_context, collate_fn, drop_last, timeout, worker_init_fn:
            as for DataLoader (``in_order`` is always on: resume relies on it), except
            that worker processes persist across epochs unless ``persistent_workers=False``
            (fresh processes start cold every epoch: epochs of 150 KB samples took 2.4x as
            long here, of 4 KB ones 15% longer); an error that ends an epoch still stops them.
            Worker processes send their batches in bundles of up to 16 (see
            :mod:`shardkit.streaming.bundles`): ``timeout`` is a batch's, so the wait for a
            bundle of ``k`` is bounded by ``k * timeout``; running out is a ``FetchError``.
        worker_mode: ``"process"`` (default: DataLoader worker processes) or ``"thread"``
            (``num_workers`` threads of this process, in the same order, with the same
            state and DDP contract; for pipelines whose work releases the GIL: see
            :mod:`shardkit.streaming.worker_modes`).
        stall_warn: seconds without a batch before the loader names the stall: where each
            worker's reader is and what it waits on, logged and in ``stats()`` (see
            :mod:`shardkit.streaming.stall`); None: never.
        stall_stacks: log the workers' Python stacks with a stall's report.
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
        sync: bool | None = None,
        worker_mode: str = "process",
        stall_warn: float | None = 300.0,
        stall_stacks: bool = False,
        **dataloader_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise ConfigError(f"WebLoader needs a ShardDataset, not {type(dataset).__name__}")
        self._fingerprint = dataset.fingerprint()  # reads the manifest once; workers get it
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self._logical = max(num_workers, 1)
        self._mailbox = Mailbox()
        self._board = CapBoard()
        side = WorkerSide(dataset, self._mailbox, batch_size or 1, self._board)
        self.worker_mode = worker_mode
        self._loader = make_workers(
            side, worker_mode, num_workers, batch_size, collate_fn, drop_last, dataloader_kwargs
        )
        self._io_base: dict[str, float] = {}
        self._epoch = dataset.epoch
        self._sync = sync
        self._end = EpochEnd()
        self._place = Place(dataset, self._logical, self._fingerprint)
        self._job_skips: dict[str, int] | None = None
        self._stats = LoaderStats()
        self._stall = StallWatch(stall_warn, stall_stacks)
        self._item_size: float | None = None  # see _item_bytes
        self._seen = [0]  # the most bytes a batch from a worker process held, so far
        self._prefetch = int(dataloader_kwargs.get("prefetch_factor") or 2)
        self._timeout = float(dataloader_kwargs.get("timeout") or 0)  # a batch's, in seconds

    # -- epochs and length ---------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (a loaded state must fit it: see
        :meth:`~shardkit.streaming.resume.Loaded.at_epoch`)."""
        if self._place.loaded is not None:
            self._place.loaded = self._place.loaded.at_epoch(epoch)
        self.dataset.set_epoch(epoch)
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs (after a load: the state's)."""
        return self._epoch

    def __len__(self) -> int:
        """Batches this rank gets in a whole epoch.

        Exact when the pipeline's length is known up front (no ``select``, ``pack_tokens``,
        shortest-``mix`` or endless resampling): every rank then has the same length by
        construction. Under a skip policy (``handler="warn"``/``"skip_shard"``) it is an
        upper bound: skipped data ends the epoch earlier, on every rank at once. Otherwise
        ``TypeError``.
        """
        lengths = self.dataset.lengths(self._logical)
        if lengths is None:
            raise TypeError(
                "the length of this loader is not known up front (select, pack_tokens, mix, "
                "batched(budget=) or endless resampling): every rank still yields the same "
                "number of batches"
            )
        if self.batch_size is None:
            return sum(lengths)
        bs = self.batch_size
        return sum(k // bs if self.drop_last else -(-k // bs) for k in lengths)

    def remaining(self) -> int | None:
        """Batches this rank still gets in the current epoch, while ``len()`` stays the
        whole epoch's (as torchdata's ``StatefulDataLoader``).

        After :meth:`load_state_dict`: those the resumed iteration yields (0 when the
        state had ended its epoch); during an epoch: those not handed out yet. None when
        not known up front: the length is not (see ``__len__``), or the state is re-planned
        for another world size or worker count (elastic).
        """
        try:
            total = len(self)
        except TypeError:
            return None
        return self._place.remaining(self._epoch, total)

    # -- iteration -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        box = self._place.begin(self._epoch)
        self._stats.start(self._epoch)
        if box is None:  # the loaded state had ended this epoch: nothing is left
            self._stats.stop()
            return iter(())
        bundling = self.worker_mode == "process" and self.num_workers > 0
        if bundling:  # how many batches a worker process's bundle may hold this epoch
            in_flight = self.num_workers * (self._prefetch + 2)
            cap = bundle_cap(self._item_bytes(), in_flight, self._seen[0] or None)
            box = {**box, "bundle": cap}
            if self._timeout:  # torch waits for an item: a bundle, each batch given timeout
                cast(Any, self._loader).timeout = self._timeout * cap
            self._board.clear()
        self._mailbox.write(box)
        if self.worker_mode == "thread":  # the workers share this process's io counters
            self._io_base = self.dataset.io_stats()
        synced = self._job() and (self._sync is True or not self._lockstep())
        self._stall.prepare()  # before worker processes start: they report to it
        it = iter(self._loader)
        batches = it
        if bundling and self._timeout and hasattr(it, "_timeout"):
            # a persistent iterator keeps the wait it was made with: this epoch's cap rules
            cast(Any, it)._timeout = self._timeout * cap
        if bundling:
            ahead = self._prefetch * self.num_workers  # items asked for before one is back
            publish = self._publisher(it, in_flight, cap)
            batches = Unbundled(it, self.num_workers, self._seen, publish, ahead)
        gen = self._iterate(it, batches, synced)
        self._stall.begin(self._place.where.rank, it, gen)
        close_at_exit(gen)
        return gen

    def _publisher(self, it: Any, in_flight: int, cap: int) -> Callable[[int, int], None]:
        """What publishes the epoch's bundle cap once the first batches' bytes are seen:
        from bundle ``index`` on, as many as fit BUNDLE_BYTES (torch's wait for an item,
        ``timeout`` a batch, follows the new cap)."""
        board, timeout = self._board, self._timeout

        def publish(index: int, seen: int) -> None:
            new = bundle_cap(None, in_flight, float(max(seen, 1)))
            board.publish(index, new)
            if timeout and hasattr(it, "_timeout"):
                it._timeout = timeout * max(cap, new)

        return publish

    def _job(self) -> bool:
        """Ranks share this loader's epochs and state: a process group is initialised and the
        data set splits by node (without ``split_by_node`` every rank reads the same data,
        e.g. an evaluation set read on rank 0 only: no collective then, so none can hang)."""
        return EpochEnd.active(self._sync) and self.dataset.splits_by_node

    def _lockstep(self) -> bool:
        """Ranks yield equal batch counts by construction: lengths known up front (the
        plan gives every rank equal shares) and no skip policy can shorten a rank's data."""
        if self._place.voting or any(s.policy != "raise" for s in self.dataset.sources):
            return False
        return self.dataset.lengths(self._logical) is not None

    def _iterate(
        self, it: Iterator[Any], batches: Iterator[Any], synced: bool
    ) -> Generator[Any, None, None]:
        """The epoch's batches (``batches``: ``it``'s, unbundled where worker processes
        bundle them), delivered; ``it`` (the DataLoader's iterator) stopped on an error."""
        stats = self._stats
        try:
            if synced:
                yield from self._voted(batches)
                return
            while True:
                t = time.perf_counter()
                got = next(batches, _END)
                if got is _END:
                    self._place.complete = True
                    return
                yield self._deliver(got, t)
        except GeneratorExit:  # the epoch was left early: persistent workers stay
            close = getattr(it, "close", None)  # thread workers' epoch: stop them now, not
            if close is not None:  # when the last reference to it goes (the stall watch's)
                close()
            raise
        except BaseException as exc:
            stop_workers(it, self._loader)  # then torch's timeout named as threads name it
            if isinstance(exc, RuntimeError) and str(exc).startswith("DataLoader timed out"):
                raise FetchError(
                    f"WebLoader: a worker process gave no batch within timeout={self._timeout} s "
                    f"(waited {getattr(it, '_timeout', 0)} s for a bundle of batches)"
                ) from exc
            raise
        finally:
            self._stall.end()
            stats.stop()

    def _voted(self, it: Iterator[Any]) -> Iterator[Any]:
        """The shared epoch end: a batch is handed out only when every rank has one. The
        vote on batch k+1 is started (asynchronously) before batch k is handed out, so it
        runs during the training step; the batch itself waits here, one ahead."""
        t = time.perf_counter()
        ahead = next(it, _END)
        vote = self._end.start(ahead is not _END, self._skips())
        while True:
            ok, job = self._end.finish(vote)
            self._job_skips = {"skipped_samples": job[0], "skipped_shards": job[1]}
            if not ok:  # a rank's data ended: the epoch ends for every rank
                self._place.complete = True
                if ahead is not _END:  # this rank's rest is never delivered: counted
                    self._stats.add({"dropped_samples": self._place.left(self._epoch)})
                return
            got = ahead
            ahead = next(it, _END)
            vote = self._end.start(ahead is not _END, self._skips())
            batch = self._deliver(got, t)
            yield batch
            t = time.perf_counter()

    def _skips(self) -> list[int]:
        counts = self._stats.totals()[0]
        return [int(counts["skipped_samples"]), int(counts["skipped_shards"])]

    def _deliver(self, got: Any, t: float) -> Any:
        """Record a batch's meta (its worker's cursor, counters) as it is handed out."""
        self._stall.beat()
        batch, meta = cast(tuple[Any, dict[str, Any]], got)
        w = int(meta["w"])
        self._place.delivered(w, meta["s"])
        wait = time.perf_counter() - t
        if self.worker_mode == "thread":  # counted once for the process, not per worker
            io = counter_delta(self.dataset.io_stats(), self._io_base)
            self._stats.record(wait, w, meta["c"], io, io_worker=-1)
            return batch
        self._stats.record(wait, w, meta["c"], meta["io"])
        return batch

    def _item_bytes(self) -> float | None:
        """About how many bytes of shards one item of this rank reads (the manifest's
        bytes over the items of every rank), None when not known up front."""
        if self._item_size is None:
            size = sum(source_bytes(s) for s in self.dataset.sources)
            lengths = self.dataset.lengths(self._logical)
            items = None if lengths is None else sum(lengths) * self._place.where.world
            if self.batch_size is not None and items is not None:
                items = -(-items // self.batch_size)
            self._item_size = size / items if size and items else -1.0
        return None if self._item_size < 0 else self._item_size

    # -- state ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The job's resume state (see :mod:`shardkit.streaming.resume`): small, JSON-safe,
        cursors only.

        Under a process group (with ``sync`` on) it gathers every rank's cursors, so it is
        the same on every rank and every rank must call it at the same step; save it once
        (rank 0) and load it on every rank of the next run. Without one it holds this rank's
        cursors (join the ranks' states with :meth:`merge_states`).
        """
        gather = self._end.gather if self._job() else None
        return self._place.job_state(self._epoch, gather)

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        epoch_mismatch: str = "raise",
        allow: Collection[str] | Mapping[str, Any] | None = None,
        reweight: bool = False,
    ) -> None:
        """Resume from the job state ``state`` at the next ``iter()``: exactly when it was
        saved by a run of this world size and worker count, else elastically re-planned.

        Args:
            state: from :meth:`state_dict` (or :meth:`merge_states`).
            epoch_mismatch: ``"raise"`` (default): a later :meth:`set_epoch` for an epoch
                the state does not fit raises; ``"discard"``: the state is dropped then.
            allow: the changes of the pipeline since the state was saved that the load
                accepts (refused by default): ``"batch_size"``, ``"sources"`` (renames:
                ``{"sources": {"old": "new"}}``), ``"seq_len"``, ``"weights"``; see
                :mod:`shardkit.streaming.allow` for how each goes on.
            reweight: ``allow={"weights"}`` (kept as an alias).

        Raises :class:`StateDictError` naming the stage and field when the state does not
        fit: another pipeline (stages, seed, shuffle buffer...), manifest content, a
        cursor out of range, or a change not allowed (naming the ``allow`` value).
        """
        epoch = self._place.load(state, epoch_mismatch, allow, reweight)
        self.dataset.set_epoch(epoch)
        self._epoch = epoch

    @staticmethod
    def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One job state from the states each rank of a job saved on its own (jobs without
        a process group, where ``state_dict()`` holds only its rank's cursors)."""
        return merge_rank_states(states)

    # -- stats ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """This rank's stats in a fixed schema (:mod:`shardkit.metrics.schema`): counts
        (ints), rates, wait p50/p99, time to first batch, the loop's idle share, per-worker
        rates, cache hits/misses, retries and errors by kind, skips; for every iteration so
        far and for the latest one (``this_epoch``). Under the shared epoch end also
        ``job_skipped_samples``/``job_skipped_shards``: the skips of every rank, summed (as
        of this rank's latest batch). :func:`shardkit.metrics.job_summary` turns it into
        the job's view; :mod:`shardkit.metrics.export` sends it to TensorBoard or Prometheus."""
        out = self._stats.summary()
        out["stalls"] = self._stall.stalls  # reports of no batch for stall_warn s
        out["stall"] = self._stall.last  # the latest: each worker's place and wait
        if self._job_skips is not None:
            out.update({f"job_{k}": v for k, v in self._job_skips.items()})
        mixture = find_mix(self.dataset.pipeline())
        if mixture is not None:  # exposure: what each source gave, as of the latest batch
            out["sources"] = mixture.exposure(*self._place.exposed())
            retired = self._place.retired
            if retired and self._place.where.rank == 0:  # job totals: rank 0's
                for name, done in retired.items():
                    out["sources"][name] = {**exposure_of(done), "share": 0.0, "weight": 0.0}
                total = sum(v["samples"] for v in out["sources"].values())
                for v in out["sources"].values():
                    v["share"] = v["samples"] / total if total else 0.0
        return out
