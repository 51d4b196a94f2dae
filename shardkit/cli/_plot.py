"""PNG pictures for ``bench --plot`` and ``inspect --plot`` (matplotlib, an optional extra).

Figures are drawn with the object API and the Agg canvas (no pyplot state, no display),
at a fixed size: :data:`BENCH_SIZE` and :data:`SHARDS_SIZE` pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardkit.errors import ConfigError

__all__ = ["BENCH_SIZE", "SHARDS_SIZE", "bench_png", "shards_png"]

DPI = 100
BENCH_SIZE = (1200, 1000)
SHARDS_SIZE = (1200, 500)


def _figure(size: tuple[int, int]) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'shardkit[plot]'") from exc
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str) -> None:
    fig.savefig(path, dpi=DPI, format="png")


def _rolling_median(y: np.ndarray, n: int) -> np.ndarray:
    if len(y) < n or n < 2:
        return y
    windows = np.lib.stride_tricks.sliding_window_view(y, n)
    med = np.median(windows, axis=1)
    return np.concatenate([np.full(n - 1, np.nan), med])


def _wait_panel(ax: Any, stats: dict[str, Any], tl: dict[str, np.ndarray]) -> None:
    wait_ms = tl["wait"] * 1e3
    steps = np.arange(1, len(wait_ms) + 1)
    ax.plot(steps, wait_ms, ".", ms=2, color="tab:blue", alpha=0.35, label="each batch")
    smooth = _rolling_median(wait_ms, max(5, len(wait_ms) // 50))
    ax.plot(steps, smooth, color="tab:blue", lw=2, label="rolling median")
    for name, key, color in (("p50", "wait_p50_s", "tab:green"), ("p99", "wait_p99_s", "tab:red")):
        v = stats[key] * 1e3
        ax.axhline(v, color=color, ls="--", lw=1, label=f"{name} {v:.2f} ms")
    starts = np.flatnonzero(np.diff(tl["iteration"]) > 0) + 1
    for i, s in enumerate(starts if len(starts) <= 12 else ()):  # else a grey wall
        ax.axvline(s + 1, color="grey", lw=0.8, ls=":", label="new epoch" if i == 0 else None)
    if len(wait_ms) and wait_ms.max() > 20 * max(np.median(wait_ms), 1e-3):
        ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("wait for the batch (ms)")
    epochs = f", {len(starts) + 1} epochs" if len(starts) else ""
    ax.set_title(
        f"Batch wait: the loop was idle {stats['wait_fraction']:.1%} of the time "
        f"(first batch after {stats['first_batch_s']:.2f} s{epochs})"
    )
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def _bins(t: np.ndarray) -> np.ndarray:
    span = float(t[-1] - t[0]) if len(t) > 1 else 1.0
    return np.linspace(t[0], t[0] + max(span, 1e-3), min(40, max(2, len(t) // 4)) + 1)


def _throughput_panel(ax: Any, tl: dict[str, np.ndarray]) -> None:
    t = tl["t"] - tl["t"][0]
    got = np.diff(tl["samples"], prepend=0.0)  # each batch's samples (one worker's)
    edges = _bins(t)
    width = np.diff(edges)
    mid = (edges[:-1] + edges[1:]) / 2
    total, _ = np.histogram(t, edges, weights=got)
    for w in np.unique(tl["worker"]).astype(int):
        mine = tl["worker"] == w
        rate, _ = np.histogram(t[mine], edges, weights=got[mine])
        ax.plot(mid, rate / width, lw=1.2, label=f"worker {w}" if w >= 0 else "main process")
    ax.plot(mid, total / width, color="black", lw=2.2, label="all workers")
    ax.set_xlabel("time since the first batch (s)")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput per worker")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)


def _cache_panel(ax: Any, stats: dict[str, Any], tl: dict[str, np.ndarray]) -> None:
    t = tl["t"] - tl["t"][0]
    ax.set_title(
        f"Cache and network: {stats['cache_hits']} hits, {stats['cache_misses']} misses "
        f"({stats['cache_hit_ratio']:.0%} hit), {stats['bytes_fetched'] / 1e6:,.1f} MB fetched "
        f"in {stats['requests']:,} requests"
    )
    if not (tl["cache_opens"].any() or tl["bytes_fetched"].any()):
        msg = "local files: nothing fetched, no cache"
        ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, fontsize=12)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.plot(t, tl["bytes_fetched"] / 1e6, color="tab:purple", lw=2, label="MB fetched")
    ax.set_xlabel("time since the first batch (s)")
    ax.set_ylabel("MB fetched (cumulative)", color="tab:purple")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(t, tl["cache_opens"], color="tab:orange", lw=2, label="opens through the cache")
    right.plot(t, tl["cache_fills"], color="tab:red", lw=1.5, ls="--", label="of them downloaded")
    right.set_ylabel("shards and indexes (cumulative)", color="tab:orange")
    right.set_ylim(bottom=0)
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)


def bench_png(path: str, stats: dict[str, Any], timeline: dict[str, np.ndarray]) -> None:
    """Batch wait over steps, throughput per worker, cache hits and bytes fetched."""
    fig = _figure(BENCH_SIZE)
    fig.suptitle(
        f"shardkit bench: {stats['samples_per_s']:,.0f} samples/s, {stats['mb_per_s']:,.1f} MB/s"
        f" ({stats['workers']} workers, batches of {stats['batch_size']}"
        f"{', decoded' if stats['decode'] else ''}, {stats['seconds']:.1f} s)",
        fontsize=13,
    )
    axes = fig.subplots(3, 1)
    if len(timeline["t"]) == 0:
        for ax in axes:
            ax.text(0.5, 0.5, "no batches", ha="center", va="center", transform=ax.transAxes)
    else:
        _wait_panel(axes[0], stats, timeline)
        _throughput_panel(axes[1], timeline)
        _cache_panel(axes[2], stats, timeline)
    _save(fig, path)


def shards_png(
    path: str, sizes: list[int], counts: list[int], good: tuple[int, int], title: str
) -> None:
    """Histograms of shard sizes (with the recommended range) and samples per shard."""
    fig = _figure(SHARDS_SIZE)
    mb = np.asarray(sizes, dtype=np.float64) / 1e6
    lo, hi = good[0] / 1e6, good[1] / 1e6
    below = int((mb < lo).sum())
    note = f"; {below:,} of them below the recommended {lo:,.0f} MB" if below else ""
    fig.suptitle(f"{title}: {len(sizes):,} shards{note}", fontsize=13)
    left, right = fig.subplots(1, 2)
    left.hist(mb, bins=min(50, max(5, len(mb) // 2)), color="tab:blue", edgecolor="white")
    if len(mb) and mb.max() >= lo / 4:  # the range only helps when shards are near it
        left.axvspan(lo, hi, color="tab:green", alpha=0.12, label="recommended size")
        left.legend(loc="upper right", fontsize=8)
    left.set_xlabel("shard size (MB)")
    left.set_ylabel("shards")
    left.set_title(
        f"shard size: median {np.median(mb) if len(mb) else 0:,.2f} MB, "
        f"min {mb.min() if len(mb) else 0:,.2f}, max {mb.max() if len(mb) else 0:,.2f}"
    )
    left.grid(alpha=0.3)
    n = np.asarray(counts, dtype=np.float64)
    right.hist(n, bins=min(50, max(5, len(n) // 2)), color="tab:orange", edgecolor="white")
    right.set_xlabel("samples per shard")
    right.set_ylabel("shards")
    right.set_title(
        f"{int(n.sum()):,} samples: median {np.median(n) if len(n) else 0:,.0f} per shard"
    )
    right.grid(alpha=0.3)
    _save(fig, path)
