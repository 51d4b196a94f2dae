"""``shardkit bench MANIFEST``: stream a shard set through the WebLoader and print its rate.

What one training rank's loader delivers: samples/s, MB/s, how long the loop waited for a
batch (mean, p99, fraction of wall time), skipped shards and the io counters (requests,
cache hits...). It streams for ``--seconds`` (starting new epochs if the data set is
small) with ``--workers`` DataLoader workers and batches of ``--batch-size``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from tqdm import tqdm

from shardkit.units import format_bytes

__all__ = ["command", "measure"]


def measure(
    source: str,
    *,
    workers: int = 2,
    batch_size: int = 32,
    seconds: float = 10.0,
    decode: bool = False,
    shuffle: int = 0,
    progress: bool | None = False,
    max_epochs: int | None = None,
    **io_options: Any,
) -> dict[str, Any]:
    """Stream ``source`` for about ``seconds`` (or ``max_epochs`` epochs, whichever ends
    first); return the loader's stats and the setup."""
    from shardkit.dataset import ShardDataset
    from shardkit.io.config import IoConfig
    from shardkit.loader import WebLoader

    ds = ShardDataset(source, io=IoConfig.make(**io_options))
    if shuffle > 1:
        ds = ds.shuffle(shuffle)
    if decode:
        ds = ds.decode()
    loader = WebLoader(ds.batched(batch_size), num_workers=workers, persistent_workers=workers > 0)
    deadline = time.perf_counter() + seconds
    bar = tqdm(desc="bench", unit=" batches", disable=None if progress is None else not progress)
    epoch = 0
    with bar:
        while time.perf_counter() < deadline and (max_epochs is None or epoch < max_epochs):
            loader.set_epoch(epoch)
            got = 0
            for _ in loader:
                got += 1
                bar.update()
                if time.perf_counter() >= deadline:
                    break
            if got == 0:
                break  # an empty data set: nothing to measure
            epoch += 1
    stats = loader.stats()
    stats.update(workers=workers, batch_size=batch_size, decode=decode, epochs=epoch)
    return stats


def render(stats: dict[str, Any]) -> str:
    """The human-readable report."""
    io = ", ".join(f"{k}={v:g}" for k, v in sorted(stats["io"].items())) or "local files"
    return "\n".join(
        [
            f"streamed {stats['samples']:,} samples ({format_bytes(stats['bytes'])}) in "
            f"{stats['seconds']:.1f} s: {stats['workers']} workers, batches of "
            f"{stats['batch_size']}{', decoded' if stats['decode'] else ''}",
            f"  samples/s  {stats['samples_per_s']:,.0f}",
            f"  MB/s       {stats['mb_per_s']:,.1f}",
            f"  wait       mean {stats['wait_mean_s'] * 1e3:.2f} ms, p99 "
            f"{stats['wait_p99_s'] * 1e3:.2f} ms, {stats['wait_fraction']:.1%} of wall time",
            f"  skipped    {stats['skipped_shards']} shards, {stats['skipped_samples']} samples",
            f"  io         {io}",
        ]
    )


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
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="How long to stream (new epochs start when one ends).",
)
@click.option(
    "--decode/--no-decode",
    default=False,
    show_default=True,
    help="Decode fields (json, npy, images...) as training would.",
)
@click.option("--shuffle", type=click.IntRange(0), default=0, help="Shuffle buffer size.")
@click.option("--cache-dir", default=None, help="Node-local cache for remote shards.")
@click.option("--json", "as_json", is_flag=True, help="Print the stats as JSON.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on stderr (default: when stderr is a terminal).",
)
def command(
    manifest: str,
    workers: int,
    batch_size: int,
    seconds: float,
    decode: bool,
    shuffle: int,
    cache_dir: str | None,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Stream MANIFEST (a manifest, url list pattern or shard) through the loader a training
    rank would use and print samples/s, MB/s and how long the training loop waited."""
    stats = measure(
        manifest,
        workers=workers,
        batch_size=batch_size,
        seconds=seconds,
        decode=decode,
        shuffle=shuffle,
        progress=progress,
        cache_dir=cache_dir,
    )
    click.echo(json.dumps(stats, indent=1) if as_json else render(stats))
