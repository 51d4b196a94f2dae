"""``shardkit inspect MANIFEST|SHARD``: totals, shard sizes, fields, first keys."""

from __future__ import annotations

import json
from typing import Any

import click

from shardkit._types import ObjectRef
from shardkit.cache import make_opener
from shardkit.check.scan import scan_shard
from shardkit.check.summary import first_keys, summarize_manifest, summarize_shard
from shardkit.cli.build import tar_policy_option
from shardkit.errors import redact
from shardkit.format.compression import SHARD_SUFFIXES
from shardkit.format.manifest.model import incomplete_reason
from shardkit.io import load_manifest
from shardkit.units import format_bytes, plural
from shardkit.urls import check_within

__all__ = ["command"]


def _manifest_summary(source: str, nkeys: int, tar_policy: str) -> dict[str, Any]:
    m = load_manifest(source)
    keys: list[str] = []
    if m.shards and nkeys:
        first = m.shards[0]
        url = m.resolve(first.url)
        check_within(url, m.base)
        with make_opener().open(ObjectRef(url, first.size, first.checksum)) as f:
            keys = first_keys(f, nkeys, url=url, tar_policy=tar_policy)
    d = summarize_manifest(m, keys=keys)
    d["path"] = source
    d["incomplete"] = incomplete_reason(m)
    return d


def _spread(d: dict[str, int], fmt: Any = format_bytes) -> str:
    return f"min {fmt(d['min'])}, median {fmt(d['median'])}, max {fmt(d['max'])}"


def _field_lines(fields: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, st in fields.items():
        missing = f", missing in {st['missing']:,}" if st["missing"] else ""
        lines.append(
            f"    {name:<16} {plural(st['count'], 'sample'):>18}  {format_bytes(st['bytes']):>10}"
            f"  (mean {format_bytes(st['mean_bytes'])}{missing})"
        )
    return lines


def _manifest_lines(d: dict[str, Any]) -> list[str]:
    lines = [
        f"manifest {d['path']}" + (" (INCOMPLETE)" if d["incomplete"] else ""),
        f"  {plural(d['shards'], 'shard')}, {plural(d['samples'], 'sample')}, "
        f"{format_bytes(d['bytes'])} "
        f"(mean sample {format_bytes(d['mean_sample_bytes'])}), "
        f"checksums {d['checksum_algorithm']}",
        f"  shard size: {_spread(d['shard_bytes'])}",
        f"  samples per shard: {_spread(d['shard_samples'], lambda v: f'{v:,}')}",
        f"  sample indexes: {d['indexed_shards']} of {plural(d['shards'], 'shard')}",
    ]
    note = _size_note(d)
    if note:
        lines.append(f"  note: {note}")
    if d["part"]:
        lines.append(f"  part {d['part']['index']} of {d['part']['count']}")
    if d["incomplete"]:
        lines.append(f"  {d['incomplete']}")
    build = (d.get("created") or {}).get("build") or {}
    if build.get("skipped_records"):
        lines.append(
            f"  the build skipped {build['skipped_records']:,} bad records "
            f"(named in {build.get('errors')})"
        )
    return lines


def _size_note(d: dict[str, Any]) -> str | None:
    """One note on shard sizes outside the range that streams well, or None: a small set
    whose shards are all small is said once, as what it is, not listed shard by shard."""
    outside = d["outside_good_range"]
    if not outside or (len(outside) == 1 and outside[0]["last"]):
        return None  # the last shard is usually smaller
    lo, hi = d["good_shard_bytes"]
    span = "-".join(format_bytes(v).replace(".00 ", " ") for v in (lo, hi))
    if all(s["size"] < lo for s in outside) and len(outside) >= d["shards"] - 1:
        if d["bytes"] < lo:
            return f"a small set, all of it under one shard of the {span} that streams best"
        return f"{plural(len(outside), 'shard')} under the {span} that streams best (--maxsize 1GB)"
    names = ", ".join(f"{s['url']} {format_bytes(s['size'])}" for s in outside[:3])
    more = f" and {len(outside) - 3} more" if len(outside) > 3 else ""
    return f"{plural(len(outside), 'shard')} outside {span}: {names}{more}"


def _shard_lines(d: dict[str, Any]) -> list[str]:
    return [
        f"shard {d['path']}",
        f"  {plural(d['samples'], 'sample')}, {format_bytes(d['bytes'])}, {d['checksum']}",
        f"  sample size (in the tar): {_spread(d['sample_bytes'])}",
    ]


def _plot(source: str, path: str, d: dict[str, Any]) -> None:
    from shardkit.cli._plot import shards_png

    m = load_manifest(source)
    sizes = [s.size for s in m.shards]
    counts = [s.nsamples for s in m.shards]
    lo, hi = d["good_shard_bytes"]
    shards_png(path, sizes, counts, (int(lo), int(hi)), redact(source))


@click.command("inspect")
@click.argument("target", metavar="MANIFEST|SHARD")
@click.option(
    "--keys",
    "nkeys",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many of the first sample keys to show.",
)
@tar_policy_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--plot", "plot_path", default=None, help="Draw shard-size histograms into this PNG.")
def command(target: str, nkeys: int, tar_policy: str, as_json: bool,
            plot_path: str | None) -> None:  # fmt: skip
    """Show what a manifest (or one shard) holds: totals, sizes, fields, first keys."""
    if target.lower().endswith(SHARD_SUFFIXES):
        if plot_path is not None:
            raise click.UsageError("--plot draws a manifest's shards; give a manifest")
        d = summarize_shard(scan_shard(target, nkeys=nkeys, tar_policy=tar_policy))
    else:
        d = _manifest_summary(target, nkeys, tar_policy)
        if plot_path is not None:
            _plot(target, plot_path, d)
    d["path"] = redact(d["path"])  # a presigned url's signature is never printed
    if as_json:
        click.echo(json.dumps(d, indent=1))
        return
    lines = _manifest_lines(d) if d["kind"] == "manifest" else _shard_lines(d)
    if d["fields"]:
        lines.append("  fields:")
        lines += _field_lines(d["fields"])
    if d["first_keys"]:
        lines.append("  first keys: " + ", ".join(d["first_keys"]))
    click.echo("\n".join(lines))
