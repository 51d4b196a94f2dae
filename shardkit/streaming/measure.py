"""Measure what a loader delivers: stream a shard set through :class:`WebLoader` for a
while and return its stats (the loader stats schema of :mod:`shardkit.metrics.schema`) with
the setup and the CPU it took. ``shardkit bench``, ``plan``, ``demo`` and ``bench --tune``
use it; so can a script.
"""

from __future__ import annotations

import dataclasses
import gc
import resource
import time
from collections.abc import Callable
from typing import Any

from shardkit.io.config import CacheConfig, IoConfig, ReaderLimits
from shardkit.metrics import tracker
from shardkit.streaming.dataset import ShardDataset
from shardkit.streaming.loader import WebLoader

__all__ = ["measure", "stream"]


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the loader's workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def stream(
    source: str,
    *,
    workers: int = 2,
    batch_size: int = 32,
    seconds: float = 10.0,
    decode: bool = False,
    shuffle: int = 0,
    prefetch_factor: int | None = None,
    on_batch: Callable[[], object] | None = None,
    max_epochs: int | None = None,
    handler: str = "raise",
    cache_dir: str | None = None,
    max_member: int | None = None,
    tar_policy: str = "strict",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stream ``source`` for about ``seconds`` (or ``max_epochs`` epochs, whichever ends
    first); ``(stats and setup, timeline)`` (see :meth:`LoaderStats.timeline`).
    ``on_batch()`` is called after every batch (a progress bar's update); ``handler`` is
    the data set's bad-data policy; ``cache_dir`` the node cache of remote shards;
    ``max_member`` and ``tar_policy`` the readers' (:class:`~shardkit.io.ReaderLimits`)."""

    limits = ReaderLimits(tar_policy=tar_policy)
    if max_member is not None:  # None: the readers' default
        limits = dataclasses.replace(limits, max_member=max_member)
    io = IoConfig(cache=CacheConfig(cache_dir=cache_dir), limits=limits)
    ds = ShardDataset(source, io=io, handler=handler)
    if shuffle > 1:
        ds = ds.shuffle(shuffle)
    if decode:
        ds = ds.decode()
    extra: dict[str, Any] = (
        {"prefetch_factor": prefetch_factor} if workers and prefetch_factor else {}
    )
    gc.collect()  # reap the workers of an earlier run before the CPU clock starts
    cpu0 = _cpu_seconds()
    loader = WebLoader(
        ds.batched(batch_size), num_workers=workers, persistent_workers=workers > 0, **extra
    )
    deadline = time.perf_counter() + seconds
    epoch = 0
    it: Any = None
    while time.perf_counter() < deadline and (max_epochs is None or epoch < max_epochs):
        loader.set_epoch(epoch)
        got = 0
        it = iter(loader)
        for _ in it:
            got += 1
            if on_batch is not None:
                on_batch()
            if time.perf_counter() >= deadline:
                break
        it.close()  # its end of iteration is counted now, not when collected
        if got == 0:
            break  # an empty data set: nothing to measure
        epoch += 1
    stats = loader.stats()
    timeline = tracker(loader).timeline()
    del loader, it
    gc.collect()  # shut the workers down, so that their CPU time is counted
    cpu = _cpu_seconds() - cpu0
    stats.update(
        workers=workers,
        batch_size=batch_size,
        decode=decode,
        prefetch_factor=prefetch_factor if workers else None,
        epochs=epoch,
        cpu_s=cpu,
        cpu_cores=cpu / stats["seconds"] if stats["seconds"] > 0 else 0.0,
    )
    return stats, timeline


def measure(source: str, **options: Any) -> dict[str, Any]:
    """Stream ``source`` (options as for :func:`stream`); the stats and the setup."""
    return stream(source, **options)[0]
