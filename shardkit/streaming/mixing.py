"""mix: a seeded, resumable mixture of several shard sets, weighted by a schedule.

(The module is ``mixing``, not ``mix``: a submodule named like the function would shadow
``shardkit.mix`` once imported.) The stage itself, its draws, per-source epochs and
exposure, is :class:`shardkit.stages.mixture.Mix`; this module builds it from data sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardkit.errors import ConfigError
from shardkit.plan.schedule import Schedule
from shardkit.stages.mixture import STOPS, Mix
from shardkit.streaming.dataset import ShardDataset
from shardkit.values import as_int

__all__ = ["mix"]

Weights = Sequence[float] | Mapping[str, float] | Schedule


def _names(
    datasets: Sequence[ShardDataset] | Mapping[str, ShardDataset], names: Sequence[str] | None
) -> tuple[list[str], list[ShardDataset]]:
    if isinstance(datasets, Mapping):
        if names is not None:
            raise ConfigError("mix: the data sets come by name: leave names= out")
        return [str(k) for k in datasets], list(datasets.values())
    sets = list(datasets)
    if names is None:
        return [f"source{i}" for i in range(len(sets))], sets
    return [str(n) for n in names], sets


def _stop(stop: str | None, longest: bool | None) -> str:
    if longest is None:
        return stop or "first"
    if stop is not None and stop != ("longest" if longest else "first"):
        raise ConfigError(f"mix: stop={stop!r} and longest={longest} disagree: give stop= only")
    return "longest" if longest else "first"


def mix(
    datasets: Sequence[ShardDataset] | Mapping[str, ShardDataset],
    weights: Weights | None = None,
    *,
    seed: int = 0,
    stop: str | None = None,
    names: Sequence[str] | None = None,
    tokens_field: str | None = None,
    longest: bool | None = None,
) -> ShardDataset:
    """A data set drawing from ``datasets`` by ``weights`` (seeded and resumable).

    Args:
        datasets: the data sets, a list or a dict name -> data set (the names then come
            from its keys; else from ``names=``, else ``source0``, ``source1``...).
        weights: a list (one per data set), a dict name -> weight, or a
            :class:`~shardkit.Schedule` of weights over the job's progress (default:
            equal weights). The progress is the samples (or tokens) the whole job drew:
            each worker counts its own draws times ``world * workers``, so it is the same
            on every rank and for any worker count, up to a batch per worker.
        seed: the draw seed; the draws are a pure function of seed, progress and the grid.
        stop: ``"first"`` (default: end when a data set runs out), ``"longest"`` (go on
            with the others until all ran out) or ``"never"`` (a data set that runs out
            starts its own next epoch: its own shuffle and split; use ``with_epoch``).
        names: the data sets' names (exposure in ``loader.stats()["sources"]``).
        tokens_field: count each sample's tokens by this field's length (exposure, and
            schedules in tokens); ``pack_tokens`` after the mix sets it.
        longest: the older spelling of ``stop="longest"``.

    Configure each data set's source (``split_by_node``, ``shuffle``, ``decode``...) before
    mixing; the result takes ``batched``, ``map``, ``pack_tokens``, ``with_epoch`` and a
    loader.
    """
    seed = as_int(seed, "mix: seed", low=0, floats=False)
    labels, sets = _names(datasets, names)
    if not sets:
        raise ConfigError("mix needs at least one data set")
    for d in sets:
        if not isinstance(d, ShardDataset):
            raise ConfigError(f"mix takes ShardDatasets, not {type(d).__name__}")
        if d.grouped:
            raise ConfigError("mix samples, not batches: call batched()/pack_tokens() after mix()")
    how = _stop(stop, longest)
    if how not in STOPS:
        raise ConfigError(f"mix: stop must be one of {STOPS}, got {stop!r}")
    if weights is None:
        schedule = Schedule.constant([1.0] * len(sets))
    elif isinstance(weights, Schedule):
        schedule = weights
    else:
        schedule = Schedule.constant(weights)
    stages = [d.pipeline().clone() for d in sets]
    stage = Mix(stages, schedule, names=labels, seed=seed, stop=how, tokens_field=tokens_field)
    return ShardDataset.over(stage, sets[0], seed=seed)
