"""``shardkit bench --tune``: choose ``num_workers`` and ``prefetch_factor`` by experiment.

Each setting streams the data set for ``--seconds`` on this machine; the CPU it takes
(this process and its workers, user + system) is measured with the rate. The choice is
the setting with the least CPU among those that feed the target rate (``--target``
samples/s, e.g. what ``shardkit plan`` says one rank needs; without one: within 5% of
the best rate measured).
"""

from __future__ import annotations

import os
from typing import Any

import click

__all__ = ["run_tune", "tune_lines"]

_ROW_KEYS = ("samples_per_s", "mb_per_s", "wait_fraction", "first_batch_s", "cpu_cores")
_NEAR_BEST = 0.95


def _ints(text: str, option: str, low: int) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(
            f"expected numbers like 1,2,4, got {text!r}", param_hint=option
        ) from None
    if not values or values[0] < low:
        raise click.BadParameter(f"expected numbers >= {low}, got {text!r}", param_hint=option)
    return values


def default_workers() -> list[int]:
    """1, 2, 4, ... up to the number of CPU cores (at least 2, at most 32)."""
    cores = min(32, max(2, os.cpu_count() or 2))
    out, n = [], 1
    while n <= cores:
        out.append(n)
        n *= 2
    return out


def run_tune(
    manifest: str,
    opts: dict[str, Any],
    workers_text: str | None,
    prefetch_text: str,
    target: float | None,
) -> dict[str, Any]:
    """Measure every setting; the rows, the target and the choice."""
    from shardkit.streaming.measure import measure

    workers = (
        default_workers() if workers_text is None else _ints(workers_text, "--tune-workers", 0)
    )
    prefetch = _ints(prefetch_text, "--tune-prefetch", 1)
    base = {k: v for k, v in opts.items() if k not in ("workers", "prefetch_factor")}
    rows: list[dict[str, Any]] = []
    for w in workers:
        for p in prefetch if w else prefetch[:1]:  # no prefetch without workers
            stats = measure(manifest, workers=w, prefetch_factor=p, **base)
            row = {"workers": w, "prefetch_factor": p if w else None}
            row.update({k: stats[k] for k in _ROW_KEYS})
            rows.append(row)
    best = max(r["samples_per_s"] for r in rows)
    wanted = target if target is not None else _NEAR_BEST * best
    feeding = [r for r in rows if r["samples_per_s"] >= wanted]
    if feeding:
        choice = min(feeding, key=lambda r: (r["cpu_cores"], r["workers"]))
    else:
        choice = max(rows, key=lambda r: r["samples_per_s"])
    return {
        "rows": rows,
        "target_samples_per_s": wanted,
        "target_from": "given" if target is not None else f"{_NEAR_BEST:.0%} of the best",
        "feeds_target": bool(feeding),
        "choice": choice,
    }


def tune_lines(result: dict[str, Any]) -> list[str]:
    """The sweep as a table and the verdict."""
    lines = [
        f"{'workers':>7} {'prefetch':>8} {'samples/s':>11} {'MB/s':>8} {'idle':>6} "
        f"{'1st batch':>9} {'CPU cores':>9}"
    ]
    for r in result["rows"]:
        pf = "-" if r["prefetch_factor"] is None else str(r["prefetch_factor"])
        lines.append(
            f"{r['workers']:>7} {pf:>8} {r['samples_per_s']:>11,.0f} {r['mb_per_s']:>8,.1f} "
            f"{r['wait_fraction']:>6.1%} {r['first_batch_s']:>8.2f}s {r['cpu_cores']:>9.2f}"
        )
    lines.append("(idle: the share of time bench's empty loop waited; high by design, not a fault)")
    c = result["choice"]
    flags = f"--workers {c['workers']}"
    if c["prefetch_factor"] is not None:
        flags += f" --prefetch-factor {c['prefetch_factor']}"
    want = f"{result['target_samples_per_s']:,.0f} samples/s ({result['target_from']})"
    if result["feeds_target"]:
        lines.append(
            f"least CPU that feeds {want}: {flags} "
            f"({c['samples_per_s']:,.0f} samples/s on {c['cpu_cores']:.2f} cores)"
        )
    else:
        lines.append(
            f"no setting feeds {want}; the fastest: {flags} "
            f"({c['samples_per_s']:,.0f} samples/s): more workers, a faster disk or "
            "network, or less decoding per sample"
        )
    return lines
