"""``shardkit plan``: the data rate a training run needs, and whether the loader delivers it.

A run consumes ``seq_len x micro_batch x accum x world_size`` tokens per optimizer step;
divided by the step time and multiplied by the bytes each token takes in the shards that
is the byte rate the data path must sustain, in all and per rank. With ``--manifest`` the
shard set's bytes per sample turn it into samples/s, and the rate one rank's loader
delivers (from ``--measured``: a ``bench --json`` file or a number in MB/s, else measured
now by streaming the manifest for ``--seconds``) is set against what one rank needs.
Exit 0 when the measured rate covers the need (or nothing was measured), 1 when not.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from shardkit.cache import make_opener
from shardkit.errors import ConfigError
from shardkit.io import load_manifest
from shardkit.units import format_bytes

__all__ = ["command", "need"]


def need(
    *,
    seq_len: int,
    micro_batch: int,
    accum: int,
    world_size: int,
    step_time: float,
    bytes_per_token: float,
    bytes_per_sample: float | None = None,
) -> dict[str, Any]:
    """The rates a run needs, in all and per rank."""
    if step_time <= 0:
        raise ConfigError(f"step time must be > 0, got {step_time}")
    sequences = micro_batch * accum * world_size / step_time
    tokens = sequences * seq_len
    out: dict[str, Any] = {
        "tokens_per_s": tokens,
        "sequences_per_s": sequences,
        "bytes_per_s": tokens * bytes_per_token,
        "bytes_per_s_per_rank": tokens * bytes_per_token / world_size,
        "sequences_per_s_per_rank": sequences / world_size,
    }
    if bytes_per_sample:
        out["bytes_per_sample"] = bytes_per_sample
        out["samples_per_s"] = out["bytes_per_s"] / bytes_per_sample
        out["samples_per_s_per_rank"] = out["samples_per_s"] / world_size
    return out


def _measured(value: str) -> float:
    """Bytes/s from a ``bench --json`` file or a number of MB/s."""
    if os.path.exists(value):
        with open(value, encoding="utf-8") as f:
            data = json.load(f)
        return float(data["mb_per_s"]) * 1e6
    try:
        return float(value) * 1e6
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a bench --json file nor a number of MB/s",
            param_hint="--measured",
        ) from None


def _report(n: dict[str, Any]) -> list[str]:
    lines = [
        f"needs {n['tokens_per_s']:,.0f} tokens/s = {format_bytes(n['bytes_per_s'])}/s "
        f"({n['sequences_per_s']:,.1f} sequences/s)",
        f"  per rank {format_bytes(n['bytes_per_s_per_rank'])}/s "
        f"({n['sequences_per_s_per_rank']:,.2f} sequences/s)",
    ]
    if "samples_per_s" in n:
        lines.append(
            f"  at {format_bytes(n['bytes_per_sample'])} per sample: "
            f"{n['samples_per_s']:,.1f} samples/s, {n['samples_per_s_per_rank']:,.2f} per rank"
        )
    if "measured_bytes_per_s" in n:
        verdict = "covers" if n["covered"] else "does NOT cover"
        lines.append(
            f"one loader measured {format_bytes(n['measured_bytes_per_s'])}/s: {verdict} "
            f"a rank's need ({n['headroom']:.1f}x)"
        )
    return lines


@click.command("plan")
@click.option("--seq-len", type=click.IntRange(1), required=True, help="Tokens per sequence.")
@click.option(
    "--micro-batch",
    type=click.IntRange(1),
    required=True,
    help="Sequences per rank per micro-step.",
)
@click.option(
    "--accum",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Gradient accumulation steps.",
)
@click.option("--world-size", type=click.IntRange(1), default=1, show_default=True, help="Ranks.")
@click.option(
    "--step-time",
    type=click.FloatRange(0, min_open=True),
    required=True,
    help="Seconds per optimizer step.",
)
@click.option(
    "--bytes-per-token",
    type=click.FloatRange(0, min_open=True),
    default=2.0,
    show_default=True,
    help="Bytes a token takes in the shards (2 for uint16 ids).",
)
@click.option(
    "--manifest", default=None, help="The shard set (bytes per sample; measured if needed)."
)
@click.option("--measured", default=None, help="A 'bench --json' file or a rate in MB/s.")
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="Workers when measuring.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0.1),
    default=5.0,
    show_default=True,
    help="How long to measure.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def command(
    seq_len: int,
    micro_batch: int,
    accum: int,
    world_size: int,
    step_time: float,
    bytes_per_token: float,
    manifest: str | None,
    measured: str | None,
    workers: int,
    seconds: float,
    as_json: bool,
) -> None:
    """Print the tokens/s, bytes/s and samples/s a training run needs; with --manifest or
    --measured, whether one rank's loader delivers it (exit 1 when it does not)."""
    per_sample = None
    if manifest is not None:
        m = load_manifest(manifest, make_opener())
        per_sample = m.total_bytes / m.total_samples if m.total_samples else None
    n = need(
        seq_len=seq_len,
        micro_batch=micro_batch,
        accum=accum,
        world_size=world_size,
        step_time=step_time,
        bytes_per_token=bytes_per_token,
        bytes_per_sample=per_sample,
    )
    rate = _measured(measured) if measured is not None else None
    if rate is None and manifest is not None:
        from shardkit.cli.bench import measure

        rate = float(measure(manifest, workers=workers, seconds=seconds)["mb_per_s"]) * 1e6
    if rate is not None:
        n["measured_bytes_per_s"] = rate
        n["headroom"] = rate / n["bytes_per_s_per_rank"]
        n["covered"] = rate >= n["bytes_per_s_per_rank"]
    click.echo(json.dumps(n, indent=1) if as_json else "\n".join(_report(n)))
    if rate is not None and not n["covered"]:
        click.get_current_context().exit(1)
