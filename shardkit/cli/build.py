"""``shardkit build SRC... -o OUT``: pack files, JSONL or small shards into shards + manifest."""

from __future__ import annotations

import json
import time

import click
from tqdm import tqdm

from shardkit.build import BuildConfig, BuildPlan, BuildResult, plan_build, run_build
from shardkit.checksum import ALGORITHMS
from shardkit.errors import ConfigError
from shardkit.sources import SOURCE_TYPES, FieldMap, parse_field_spec
from shardkit.units import format_bytes, parse_size

__all__ = ["command", "parse_part", "parse_size_option"]


def parse_size_option(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A click callback: ``"1GB"`` → bytes, a bad size is a usage error."""
    try:
        return parse_size(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_part(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, int] | None:
    """A click callback: ``"I/N"`` → ``(I, N)`` with ``0 <= I < N``."""
    if value is None:
        return None
    i, sep, n = value.partition("/")
    if not sep or not i.strip().isdigit() or not n.strip().isdigit():
        raise click.BadParameter(f"want I/N (e.g. 0/4), got {value!r}")
    part = int(i), int(n)
    if not 0 <= part[0] < part[1]:
        raise click.BadParameter(f"want 0 <= I < N, got {value!r}")
    return part


def _fields(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[FieldMap, ...]:
    try:
        maps = tuple(parse_field_spec(v) for v in value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    names = [m.name for m in maps]
    if len(set(names)) != len(names):
        raise click.BadParameter("a record field is mapped twice")
    return maps


def _run(plan: BuildPlan, show: bool) -> BuildResult:
    t0 = time.perf_counter()
    samples = 0
    with tqdm(
        total=plan.total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc="build",
        disable=None if show else True,
        dynamic_ncols=True,
    ) as bar:

        def progress(n: int, nbytes: int) -> None:
            nonlocal samples
            samples += n
            rate = samples / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{samples:,} samples, {rate:,.0f} samples/s", refresh=False)
            bar.update(nbytes)

        return run_build(plan, progress=progress)


def _report(result: BuildResult) -> None:
    d = result.to_dict()
    m = result.manifest
    click.echo(
        f"built {d['shards']} shards ({format_bytes(d['bytes'])}, {d['samples']:,} samples) "
        f"in {d['seconds']:.2f} s: {d['samples_per_s']:,.0f} samples/s, {d['mb_per_s']:.1f} MB/s"
        + (f" with {d['workers']} workers" if d["workers"] > 1 else "")
    )
    if result.resumed_samples:
        click.echo(f"resumed: kept {result.resumed_samples:,} samples already in whole shards")
    if m.fields:
        fields = ", ".join(f"{k} ({format_bytes(v['bytes'])})" for k, v in sorted(m.fields.items()))
        click.echo(f"fields: {fields}")
    click.echo(f"manifest: {result.manifest_path}")


@click.command("build")
@click.argument("sources", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory for the shards and manifest.json.",
)
@click.option(
    "--maxsize",
    default="1GB",
    show_default=True,
    callback=parse_size_option,
    help="Largest shard size (0.5-2 GB is what streaming wants).",
)
@click.option("--maxcount", type=click.IntRange(min=1), help="Most samples per shard.")
@click.option("--prefix", default="data", show_default=True, help="Shard names: PREFIX-000000.tar.")
@click.option("--checksum", type=click.Choice(ALGORITHMS), default="sha256", show_default=True)
@click.option("--compress", type=click.Choice(["zstd"]), help="Compress whole shards (.tar.zst).")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Parallel writer processes (the output for a given N is reproducible).",
)
@click.option(
    "--part",
    callback=parse_part,
    metavar="I/N",
    help="Build only part I of N (a partial manifest for `shardkit manifest merge`).",
)
@click.option("--resume", is_flag=True, help="Finish an interrupted build in OUT.")
@click.option(
    "--field",
    "fields",
    multiple=True,
    callback=_fields,
    metavar="NAME=EXT[:DTYPE]",
    help="JSONL: store record field NAME as member NAME.EXT (tokens=npy:int32).",
)
@click.option("--key-field", help="JSONL: the record field holding the sample key.")
@click.option(
    "--source-type",
    type=click.Choice(SOURCE_TYPES),
    default="auto",
    show_default=True,
    help="How to read directories.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def command(
    sources: tuple[str, ...],
    out_dir: str,
    maxsize: int,
    maxcount: int | None,
    prefix: str,
    checksum: str,
    compress: str | None,
    workers: int,
    part: tuple[int, int] | None,
    resume: bool,
    fields: tuple[FieldMap, ...],
    key_field: str | None,
    source_type: str,
    as_json: bool,
    progress: bool,
) -> None:
    """Pack SOURCES into WebDataset-format shards with a checksum manifest.

    SOURCES are directories of files (grouped into samples by key: a/x.jpg + a/x.json is
    sample a/x), JSONL files (.jsonl, .jsonl.zst; one sample a line) or tar shards to
    re-shard (brace patterns like data-{000000..000099}.tar work).
    """
    config = BuildConfig(
        prefix=prefix,
        maxsize=maxsize,
        maxcount=maxcount,
        checksum=checksum,
        compress=compress,
        workers=workers,
        part=part,
        resume=resume,
        source_type=source_type,
        fields=fields,
        key_field=key_field,
    )
    try:
        plan = plan_build(list(sources), out_dir, config)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    result = _run(plan, progress)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        _report(result)
