"""``shardkit bench MANIFEST``: stream a shard set through the WebLoader and print its rate.

What one training rank's loader delivers, in the loader stats schema
(:mod:`shardkit.metrics.schema`): samples/s, MB/s, time to the first batch, how long the
loop waited for a batch (p50, p99, and the share of wall time, near 100% here because the
loop does no work), per-worker rates, cache hits and
bytes fetched, retries, errors and skips, and the CPU it took. It streams for
``--seconds`` (starting new epochs if the data set is small) with ``--workers``
DataLoader workers and batches of ``--batch-size``. ``--plot FILE.png`` draws the run;
``--tune`` sweeps workers x prefetch factor and names the cheapest setting that feeds a
target rate.
"""

from __future__ import annotations

import json
import math
from typing import Any

import click
from tqdm import tqdm

from shardkit.cli.build import parse_size_option, tar_policy_option
from shardkit.units import format_bytes, plural

__all__ = ["command", "render"]


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def render(stats: dict[str, Any]) -> str:
    """The human-readable report."""
    s = stats
    lines = [
        f"streamed {plural(s['samples'], 'sample')} ({format_bytes(s['bytes'])}) in "
        f"{s['seconds']:.1f} s: {plural(s['workers'], 'worker')}, batches of "
        f"{s['batch_size']}{', decoded' if s['decode'] else ''}",
        f"  samples/s    {s['samples_per_s']:,.0f}  ({s['batches_per_s']:,.1f} batches/s)",
        f"  MB/s         {s['mb_per_s']:,.1f}",
        f"  first batch  {s['first_batch_s']:.2f} s",
        f"  wait         p50 {_ms(s['wait_p50_s'])}, p99 {_ms(s['wait_p99_s'])}, "
        f"max {_ms(s['wait_max_s'])}",
        f"  idle         {s['wait_fraction']:.1%} of wall time: bench's loop does no work, so it "
        "waits on the loader by design (not a problem);",
        "               in training, compare samples/s with what a step takes (shardkit plan)",
    ]
    busy = s["time_worker_s"]
    if busy > 0:
        parts = [("read", "time_read_s"), ("decode", "time_decode_s")]
        parts += [("collate", "time_collate_s"), ("parse, shuffle, maps", "time_other_s")]
        shares = ", ".join(f"{name} {s[k] / busy:.0%}" for name, k in parts)
        lines.append(f"  worker time  {busy:.2f} s: {shares}")
        lines.append(
            f"  also         verify {s['time_verify_s']:.2f} s (hashing, any thread), "
            f"transfer {s['time_transfer_s']:.2f} s (worker processes to this one)"
        )
    workers = s["per_worker"]
    if len(workers) > 1:
        rates = ", ".join(f"{w['samples_per_s']:,.0f}" for w in workers)
        lines.append(f"  per worker   {rates} samples/s")
    if s["cache_hits"] or s["cache_misses"] or s["bytes_fetched"]:
        lines.append(
            f"  cache        {plural(s['cache_hits'], 'hit')}, "
            f"{plural(s['cache_misses'], 'miss', 'misses')} "
            f"({s['cache_hit_ratio']:.0%} hit), {format_bytes(s['bytes_fetched'])} fetched "
            f"in {plural(s['requests'], 'request')}"
        )
    lines.append(
        f"  problems     {plural(s['retries'], 'retry', 'retries')}, "
        f"{plural(s['errors'], 'error')}, {plural(s['skipped_shards'], 'shard')} / "
        f"{plural(s['skipped_samples'], 'sample')} skipped"
        + (
            f", {plural(s['skipped_members'], 'tar member')} skipped"
            if s["skipped_members"]
            else ""
        )
    )
    if "cpu_cores" in s:
        lines.append(f"  CPU          {s['cpu_cores']:.2f} cores ({s['cpu_s']:.1f} s)")
    return "\n".join(lines)


class Finite(click.FloatRange):
    """A ``click.FloatRange`` that refuses NaN and infinity (FloatRange lets NaN through:
    every comparison with it is False)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


@click.command("bench")
@click.argument("manifest")
@click.option(
    "--workers",
    type=click.IntRange(0, 256),
    default=2,
    show_default=True,
    help="DataLoader worker processes.",
)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option(
    "--seconds",
    type=Finite(0.1),
    default=10.0,
    show_default=True,
    help="How long to stream (new epochs start when one ends); per setting with --tune.",
)
@click.option(
    "--decode/--no-decode",
    default=False,
    show_default=True,
    help="Decode fields (json, npy, images...) as training would.",
)
@click.option("--shuffle", type=click.IntRange(0), default=0, help="Shuffle buffer size.")
@click.option(
    "--epochs", "max_epochs", type=click.IntRange(1), default=None, help="Stop after N epochs."
)
@click.option("--prefetch-factor", type=click.IntRange(1), default=None, help="Per worker.")
@click.option("--cache-dir", default=None, help="Node-local cache for remote shards.")
@click.option(
    "--max-member",
    default="1GiB",
    show_default=True,
    callback=parse_size_option,
    help="The largest tar member a reader holds in memory; a larger one is an error.",
)
@tar_policy_option
@click.option(
    "--handler",
    type=click.Choice(["raise", "warn", "skip_shard"]),
    default="raise",
    show_default=True,
    help="Bad data: stop with one line naming shard and offset, or warn / skip the shard "
    "and count it (as ShardDataset's handler).",
)
@click.option("--plot", "plot_path", default=None, help="Draw the run into this PNG.")
@click.option("--tune", is_flag=True, help="Sweep workers x prefetch factor; name the best.")
@click.option("--tune-workers", default=None, help="Worker counts to try (default 1,2,4..).")
@click.option("--tune-prefetch", default="2,4", show_default=True, help="Prefetch factors.")
@click.option("--target", type=Finite(0), default=None, help="Samples/s to feed (--tune).")
@click.option("--json", "as_json", is_flag=True, help="Print the stats as JSON.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on stderr (default: when stderr is a terminal).",
)
def command(manifest: str, plot_path: str | None, as_json: bool, **opts: Any) -> None:
    """Stream MANIFEST (a manifest, url list pattern or shard) through the loader a training
    rank would use and print samples/s, MB/s, the first batch and where the time went (the
    loop does no work, so it waits on the loader by design: compare samples/s with what a
    training step takes, `shardkit plan`)."""
    tune, tune_workers, tune_prefetch = (
        opts.pop("tune"),
        opts.pop("tune_workers"),
        opts.pop("tune_prefetch"),
    )
    target = opts.pop("target")
    show = opts.pop("progress")
    if tune:
        from shardkit.cli._tune import run_tune, tune_lines

        result = run_tune(manifest, opts, tune_workers, tune_prefetch, target)
        click.echo(json.dumps(result, indent=1) if as_json else "\n".join(tune_lines(result)))
        if not result["feeds_target"]:
            click.get_current_context().exit(1)
        return
    from shardkit.streaming.measure import stream  # imports torch: only when streaming

    with tqdm(desc="bench", unit=" batches", disable=None if show is None else not show) as bar:
        stats, timeline = stream(manifest, on_batch=bar.update, **opts)
    if plot_path is not None:
        from shardkit.cli._plot import bench_png

        bench_png(plot_path, stats, timeline)
    click.echo(json.dumps(stats, indent=1) if as_json else render(stats))
