"""The job-wide view of the loader stats: summed, min, max and mean across ranks."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from shardkit.errors import ConfigError

__all__ = ["job_summary", "scalars"]

_LABELS = ("schema", "epoch", "iterations")


def scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The top-level numbers of a stats summary (no lists, dicts or labels), sorted by key."""
    return {
        k: float(v)
        for k, v in sorted(summary.items())
        if k not in _LABELS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def job_summary(summary: Mapping[str, Any], *, group: Any = None) -> dict[str, Any]:
    """The job's view of every rank's ``loader.stats()``: a collective.

    **Every rank of the group must call it, at the same point** (like any
    ``torch.distributed`` collective, a rank that does not call it hangs the others).
    Returns, on every rank, ``{"world_size", "sum", "min", "max", "mean"}``, each over
    the top-level numbers of the schema: ``sum["samples_per_s"]`` is the job's
    throughput, ``max["wait_fraction"]`` the idlest rank's share, ``sum["errors"]`` the
    job's errors. Counts stay ``int``. With a mixture also ``sources``: per source name the
    job's ``samples`` and ``tokens`` (summed), ``epochs`` and ``weight`` (the largest of the
    ranks') and the realized ``share``. Without an initialised process group it is the
    view of a job of one rank. Under NCCL the numbers travel on the current CUDA device.
    """
    import torch
    import torch.distributed as dist

    flat = _flat_sources(summary)
    local = {**scalars(summary), **flat}
    keys = list(local)
    ints = {k for k in keys if isinstance({**summary, **flat}[k], int)}
    shape = [float(len(keys)), float(zlib.crc32("\n".join(keys).encode()))]
    values = torch.tensor(list(local.values()), dtype=torch.float64)
    if not (dist.is_available() and dist.is_initialized()):
        row = values.tolist()
        return _view(1, keys, ints, row, row, row)
    world = dist.get_world_size(group)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"

    def reduce(t: torch.Tensor, op: Any) -> list[float]:
        t = t.to(device)
        dist.all_reduce(t, op=op, group=group)
        out: list[float] = t.cpu().tolist()
        return out

    # first the keys' count and names (a fixed-size check), so that a rank with other
    # keys is refused on every rank instead of breaking the next collective; min and max
    # in one MAX over (x, -x)
    check = torch.tensor(shape, dtype=torch.float64)
    bounds = reduce(torch.cat([check, -check]), dist.ReduceOp.MAX)
    if bounds[:2] != [-v for v in bounds[2:]]:
        raise ConfigError("job_summary: the ranks' stats have different keys")
    total = reduce(values.clone(), dist.ReduceOp.SUM)
    both = reduce(torch.cat([values, -values]), dist.ReduceOp.MAX)
    n = len(keys)
    high, low = both[:n], [-v for v in both[n:]]
    return _view(world, keys, ints, total, low, high)


def _view(
    world: int,
    keys: list[str],
    ints: set[str],
    total: list[float],
    low: list[float],
    high: list[float],
) -> dict[str, Any]:
    def pack(row: list[float], keep_int: bool = True) -> dict[str, float | int]:
        return {
            k: (round(v) if keep_int and k in ints else v) for k, v in zip(keys, row, strict=True)
        }

    view = {
        "world_size": world,
        "sum": pack(total),
        "min": pack(low),
        "max": pack(high),
        "mean": pack([v / world for v in total], keep_int=False),
    }
    sources = _job_sources(view)
    return {**view, "sources": sources} if sources else view


_SOURCE = "sources."  # a source's numbers in the flat view: sources.<name>.<key>


def _flat_sources(summary: Mapping[str, Any]) -> dict[str, int | float]:
    """The per-source exposure of a loader's stats as flat numbers (share left out: the
    job's is recomputed from the summed samples)."""
    out: dict[str, int | float] = {}
    for name, row in (summary.get("sources") or {}).items():
        for key in ("samples", "tokens", "epochs", "weight"):
            out[f"{_SOURCE}{name}.{key}"] = row[key]
    return out


def _job_sources(view: Mapping[str, Any]) -> dict[str, dict[str, float | int]]:
    """The job's exposure per source: samples and tokens summed over the ranks, the
    latest epoch and the scheduled weight (the largest of the ranks'), the realized share."""
    total, high = view["sum"], view["max"]
    names = sorted({k[len(_SOURCE) :].rsplit(".", 1)[0] for k in total if k.startswith(_SOURCE)})
    every = sum(total[f"{_SOURCE}{n}.samples"] for n in names)
    return {
        n: {
            "samples": total[f"{_SOURCE}{n}.samples"],
            "tokens": total[f"{_SOURCE}{n}.tokens"],
            "epochs": high[f"{_SOURCE}{n}.epochs"],
            "share": total[f"{_SOURCE}{n}.samples"] / every if every else 0.0,
            "weight": high[f"{_SOURCE}{n}.weight"],
        }
        for n in names
    }
