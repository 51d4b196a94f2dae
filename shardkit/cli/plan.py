"""``shardkit plan``: the data rate a training run needs, and whether the loader delivers it.

Two kinds of run:

- **tokens** (``--seq-len``): a step consumes ``seq_len x micro_batch x accum x
  world_size`` tokens. With ``--manifest`` the token field's statistics (its dtype, read
  from one npy header, and its bytes in the manifest) give the tokens per sample, hence
  the samples/s, and the shard bytes per sample give the bytes/s to read. Without a
  manifest, ``--bytes-per-token`` turns tokens into bytes.
- **samples** (no ``--seq-len``: images and other one-sample-per-example sets): a step
  consumes ``micro_batch x accum x world_size`` samples; the manifest's bytes per
  sample give the bytes/s.

Then the rate one rank needs is set against what one rank's loader delivers on this
machine (``--measured``: a ``bench --json`` file or a number of MB/s; else measured now
by streaming the manifest for ``--seconds``, decoding as training does unless
``--no-decode``; the report says whether the rate was decoded): the verdict, the
headroom and the workers it would take. Exit 0 when the measured rate covers the need
(or nothing was measured), 1 when not.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import click

from shardkit.cache import make_opener
from shardkit.cli.bench import Finite
from shardkit.cli.build import tar_policy_option
from shardkit.errors import ConfigError
from shardkit.io import load_manifest
from shardkit.units import format_bytes, plural

__all__ = ["command", "need"]


def need(
    *,
    seq_len: int | None,
    micro_batch: int,
    accum: int,
    world_size: int,
    step_time: float,
    bytes_per_token: float | None = None,
    bytes_per_sample: float | None = None,
    tokens_per_sample: float | None = None,
) -> dict[str, Any]:
    """The rates a run needs, in all and per rank (``seq_len`` None: a samples run)."""
    if step_time <= 0:
        raise ConfigError(f"step time must be > 0, got {step_time}")
    examples = micro_batch * accum * world_size / step_time
    out: dict[str, Any] = {"mode": "tokens" if seq_len else "samples"}
    samples = rate = tokens = None
    if seq_len:
        tokens = examples * seq_len
        out["tokens_per_s"] = tokens
        out["sequences_per_s"] = examples
        out["sequences_per_s_per_rank"] = examples / world_size
        if tokens_per_sample:
            out["tokens_per_sample"] = tokens_per_sample
            samples = tokens / tokens_per_sample
        elif bytes_per_token:
            rate = tokens * bytes_per_token
    else:
        samples = examples
    if bytes_per_sample:
        out["bytes_per_sample"] = bytes_per_sample
        if samples is not None:
            rate = samples * bytes_per_sample
        elif rate is not None:
            samples = rate / bytes_per_sample
    if samples is not None:
        out["samples_per_s"] = samples
        out["samples_per_s_per_rank"] = samples / world_size
    if rate is not None:
        out["bytes_per_s"] = rate
        out["bytes_per_s_per_rank"] = rate / world_size
        if tokens:
            out["bytes_per_token"] = rate / tokens
    return out


def _measured(value: str) -> dict[str, Any]:
    """A ``bench --json`` file's stats, or ``{"mb_per_s": value}``."""
    if os.path.exists(value):
        try:
            with open(value, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise click.BadParameter(
                f"{value}: not a bench --json file: {exc}", param_hint="--measured"
            ) from None
        if not isinstance(data, dict) or "mb_per_s" not in data:
            raise click.BadParameter(f"{value} has no mb_per_s", param_hint="--measured")
    else:
        try:
            data = {"mb_per_s": float(value)}
        except ValueError:
            raise click.BadParameter(
                f"{value!r} is neither a bench --json file nor a number of MB/s",
                param_hint="--measured",
            ) from None
    rate = data["mb_per_s"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < math.inf:
        raise click.BadParameter(
            f"a rate must be a number of MB/s >= 0, got {rate!r}", param_hint="--measured"
        )
    return data


def verdict(n: dict[str, Any], stats: dict[str, Any]) -> None:
    """Add what was measured, whether it covers one rank's need and the workers it takes."""
    rate = float(stats["mb_per_s"]) * 1e6
    n["measured_bytes_per_s"] = rate
    if isinstance(stats.get("decode"), bool):
        n["measured_decoded"] = stats["decode"]
    samples = stats.get("samples_per_s")
    if samples is None and n.get("bytes_per_sample"):
        samples = rate / n["bytes_per_sample"]
    if samples is not None:
        n["measured_samples_per_s"] = float(samples)
    if samples is not None and "samples_per_s_per_rank" in n:
        want, have = n["samples_per_s_per_rank"], float(samples)
    elif "bytes_per_s_per_rank" in n:
        want, have = n["bytes_per_s_per_rank"], rate
    else:
        return  # nothing to set the rate against
    n["headroom"] = have / want if want else math.inf
    n["covered"] = have >= want
    workers = stats.get("workers")
    if isinstance(workers, int) and have > 0:
        n["measured_workers"] = workers
        per_worker = have / max(workers, 1)
        n["workers_needed"] = max(1, math.ceil(want / per_worker))


def _report(n: dict[str, Any]) -> list[str]:
    lines = []
    if n["mode"] == "tokens":
        lines.append(
            f"needs {n['tokens_per_s']:,.0f} tokens/s ({n['sequences_per_s']:,.1f} sequences/s, "
            f"{n['sequences_per_s_per_rank']:,.2f} per rank)"
        )
        if "tokens_per_sample" in n:
            lines.append(
                f"  {n['token_field']}: {n['token_dtype']}, {n['tokens_per_sample']:,.1f} tokens "
                f"a sample, {n['bytes_per_sample']:,.0f} shard bytes a sample "
                f"({n['bytes_per_token']:.2f} bytes/token)"
            )
    if "samples_per_s" in n:
        lines.append(
            f"needs {n['samples_per_s']:,.1f} samples/s, {n['samples_per_s_per_rank']:,.2f} "
            "per rank"
        )
    if "bytes_per_s" in n:
        lines.append(
            f"needs {format_bytes(n['bytes_per_s'])}/s, "
            f"{format_bytes(n['bytes_per_s_per_rank'])}/s per rank"
        )
    if "measured_bytes_per_s" in n:
        got = f"{format_bytes(n['measured_bytes_per_s'])}/s"
        if "measured_samples_per_s" in n:
            got = f"{n['measured_samples_per_s']:,.0f} samples/s ({got})"
        if "measured_workers" in n:
            got += f" with {plural(n['measured_workers'], 'worker')}"
        decoded = n.get("measured_decoded")
        if decoded is not None:
            got += (
                ", decoded"
                if decoded
                else ", NOT decoded (decode costs left out: a run that decodes gets less)"
            )
        lines.append(f"one loader on this machine measured {got}")
    if "covered" in n:
        verdict_text = "covers" if n["covered"] else "does NOT cover"
        line = f"  {verdict_text} a rank's need ({n['headroom']:.1f}x)"
        if "workers_needed" in n:
            k = n["workers_needed"]
            line += f"; about {plural(k, 'worker')} would feed it"
        lines.append(line)
    return lines


@click.command("plan")
@click.option("--seq-len", type=click.IntRange(1), default=None, help="Tokens per sequence.")
@click.option(
    "--micro-batch",
    type=click.IntRange(1),
    required=True,
    help="Sequences (or images) per rank per micro-step.",
)
@click.option("--accum", type=click.IntRange(1), default=1, show_default=True)
@click.option("--world-size", type=click.IntRange(1), default=1, show_default=True, help="Ranks.")
@click.option(
    "--step-time",
    type=Finite(0, min_open=True),
    required=True,
    help="Seconds per optimizer step.",
)
@click.option(
    "--bytes-per-token",
    type=Finite(0, min_open=True),
    default=None,
    help="Without a manifest: bytes a token takes (default 2, uint16 ids).",
)
@click.option("--manifest", default=None, help="The shard set (its field statistics).")
@click.option("--token-field", default=None, help="The token field (default: guessed).")
@click.option("--token-dtype", default=None, help="Its dtype (default: read from the data).")
@click.option("--measured", default=None, help="A 'bench --json' file or a rate in MB/s.")
@click.option("--workers", type=click.IntRange(0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option(
    "--decode/--no-decode",
    default=True,
    show_default=True,
    help="Decode when measuring, as training does (--no-decode leaves out the decode cost: "
    "for images, a rate many times what a run gets).",
)
@click.option("--cache-dir", default=None, help="Node-local cache for remote shards.")
@click.option("--seconds", type=Finite(0.1), default=5.0, show_default=True)
@tar_policy_option
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def command(**o: Any) -> None:
    """Print the tokens/s, samples/s and bytes/s a training run needs; with --manifest or
    --measured, whether one rank's loader delivers it (exit 1 when it does not)."""
    per_sample = tokens = None
    info: dict[str, Any] = {}
    manifest = o["manifest"]
    if manifest is not None:
        opener = make_opener()  # no cache: a peek at one npy header need not fill one
        m = load_manifest(manifest, opener)
        per_sample = m.total_bytes / m.total_samples if m.total_samples else None
        if o["seq_len"] and (o["token_field"] or o["bytes_per_token"] is None):
            from shardkit.cli._fields import token_field

            tf = token_field(
                m, opener, o["token_field"], o["token_dtype"], tar_policy=o["tar_policy"]
            )
            tokens = tf.tokens_per_sample
            info = {"token_field": tf.name, "token_dtype": tf.dtype}
    bpt = o["bytes_per_token"] or (None if tokens else 2.0)
    n = need(
        seq_len=o["seq_len"],
        micro_batch=o["micro_batch"],
        accum=o["accum"],
        world_size=o["world_size"],
        step_time=o["step_time"],
        bytes_per_token=bpt,
        bytes_per_sample=per_sample,
        tokens_per_sample=tokens,
    )
    n.update(info)
    stats = _measured(o["measured"]) if o["measured"] is not None else None
    if stats is None and manifest is not None:
        from shardkit.streaming.measure import measure

        stats = measure(
            manifest,
            workers=o["workers"],
            batch_size=o["batch_size"],
            decode=o["decode"],
            seconds=o["seconds"],
            cache_dir=o["cache_dir"],
            tar_policy=o["tar_policy"],
        )
    if stats is not None:
        verdict(n, stats)
    click.echo(json.dumps(n, indent=1) if o["as_json"] else "\n".join(_report(n)))
    if n.get("covered") is False:
        click.get_current_context().exit(1)
