"""``shardkit build SRC... -o OUT``: pack files, JSONL or small shards into shards + manifest."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import click
from tqdm import tqdm

from shardkit.errors import ConfigError
from shardkit.format.checksum import ALGORITHMS
from shardkit.format.images import REENCODE_FORMATS, ImageOptions
from shardkit.units import format_bytes, parse_size
from shardkit.write.build import BuildConfig, BuildPlan, BuildResult, plan_build, run_build
from shardkit.write.inputs.select import TreeOptions, parse_require
from shardkit.write.inputs.sources import ON_ERROR, SOURCE_TYPES, FieldMap, parse_field_spec

__all__ = ["command", "parse_part", "parse_size_option", "tar_policy_option"]

tar_policy_option = click.option(
    "--tar-policy",
    type=click.Choice(["strict", "lenient"]),
    default="strict",
    show_default=True,
    help="Links, devices, FIFOs and unknown member types in tars: refuse the shard naming it "
    "and the offset (strict), or skip the member, counted and warned naming the shard "
    "(lenient).",
)
"""The ``--tar-policy`` option of every command that reads tars."""


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


def _require(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[tuple[str, ...], ...]:
    if not value:
        return ()
    try:
        return parse_require(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


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


def _how_to_resume(plan: BuildPlan) -> str:
    """What a Ctrl-C'd build says: what it kept and the command that finishes it."""
    args = [a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")]
    again = shlex.join(["shardkit", *args, "--resume"])
    return (
        f"the whole shards written so far are kept in {plan.out_dir}; "
        f"finish the build with: {again}"
    )


def _report(result: BuildResult) -> None:
    d = result.to_dict()
    m = result.manifest
    if result.nothing_to_do:
        click.echo(
            f"nothing to do: {result.manifest_path} is a finished build of these inputs "
            f"({d['shards']} shards, {d['samples']:,} samples); --overwrite builds it again"
        )
        return
    click.echo(
        f"built {d['shards']} shards ({format_bytes(d['bytes'])}, {d['samples']:,} samples) "
        f"in {d['seconds']:.2f} s: {d['samples_per_s']:,.0f} samples/s, {d['mb_per_s']:.1f} MB/s"
        + (f" with {d['workers']} workers" if d["workers"] > 1 else "")
    )
    if result.resumed_samples:
        click.echo(f"resumed: kept {result.resumed_samples:,} samples already in whole shards")
    info = m.created.get("build") or {}
    if info.get("skipped_records"):
        report = os.path.join(os.path.dirname(result.manifest_path), info["errors"])
        click.echo(f"skipped {info['skipped_records']:,} bad records: each is named in {report}")
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
    help="Output directory for the shards and manifest.json, or an object-store prefix "
    "(s3://bucket/prefix/, gs://, az://): shards are streamed up as they are written, the "
    "manifest last.",
)
@click.option(
    "--maxsize",
    default="1GB",
    show_default=True,
    callback=parse_size_option,
    help="Largest shard size, counted in uncompressed tar bytes (a --compress'ed shard is "
    "smaller on disk); 0.5-2 GB is what streaming wants.",
)
@click.option("--maxcount", type=click.IntRange(min=1), help="Most samples per shard.")
@click.option(
    "--max-member",
    default="1GiB",
    show_default=True,
    callback=parse_size_option,
    help="Tar inputs: the largest member held in memory; a larger one stops the build.",
)
@click.option(
    "--max-record",
    default="256MiB",
    show_default=True,
    callback=parse_size_option,
    help="JSONL/Parquet: the largest line or row, checked as it is read; a longer one is "
    "a bad record (left out and reported with --on-error skip).",
)
@click.option(
    "--check-images",
    type=click.Choice(["header", "decode", "off"]),
    default="header",
    show_default=True,
    help="Check image fields of folders and Parquet as they are read (header: readable and "
    "not truncated; decode: decoded whole); a bad one stops the build (or is "
    "skipped and reported with --on-error skip).",
)
@tar_policy_option
@click.option("--prefix", default="data", show_default=True, help="Shard names: PREFIX-000000.tar.")
@click.option("--checksum", type=click.Choice(ALGORITHMS), default="sha256", show_default=True)
@click.option(
    "--compress",
    type=click.Choice(["zstd", "gzip"]),
    help="Compress whole shards: zstd (.tar.zst, fastest) or gzip (.tar.gz, which "
    "webdataset and Hugging Face datasets read too).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Parallel writer processes (the output for a given N is reproducible). "
    "Default: one per 256 MB of input, at most the CPU count.",
)
@click.option(
    "--part",
    callback=parse_part,
    metavar="I/N",
    help="Build only part I of N (a partial manifest for `shardkit manifest merge`).",
)
@click.option("--resume", is_flag=True, help="Finish an interrupted build in OUT.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Delete what an earlier build left in OUT (its manifest, shards, indexes) first.",
)
@click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    default="raise",
    show_default=True,
    help="skip: leave bad records out, name each in manifest.errors.jsonl, and finish.",
)
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Folders: only files matching GLOB (repeatable; case-insensitive; '*.jpg').",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Folders: leave out files matching GLOB (repeatable; '*.md').",
)
@click.option(
    "--require-fields",
    callback=_require,
    metavar="F[;ALT],...",
    help="Folders: every sample must have these fields (jpg;png,json: an image in jpg "
    "or png, and a json); others fail the build (or are left out with --on-error skip).",
)
@click.option(
    "--resize",
    type=click.IntRange(min=1),
    metavar="MAXSIDE",
    help="Folders: shrink images whose longer side is above MAXSIDE pixels.",
)
@click.option(
    "--reencode",
    type=click.Choice(REENCODE_FORMATS),
    help="Folders: store every image in this format (the field is renamed).",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    default=90,
    show_default=True,
    help="JPEG/WebP quality for --resize/--reencode.",
)
@click.option(
    "--field",
    "fields",
    multiple=True,
    callback=_fields,
    metavar="NAME=EXT[:DTYPE]",
    help="JSONL/Parquet: store field NAME as member NAME.EXT (tokens=npy:int32).",
)
@click.option("--key-field", help="JSONL/Parquet: the field holding the sample key.")
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
    max_member: int,
    max_record: int,
    check_images: str,
    tar_policy: str,
    prefix: str,
    checksum: str,
    compress: str | None,
    workers: int | None,
    part: tuple[int, int] | None,
    resume: bool,
    overwrite: bool,
    on_error: str,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    require_fields: tuple[tuple[str, ...], ...],
    resize: int | None,
    reencode: str | None,
    quality: int,
    fields: tuple[FieldMap, ...],
    key_field: str | None,
    source_type: str,
    as_json: bool,
    progress: bool,
) -> None:
    """Pack SOURCES into WebDataset-format shards with a checksum manifest.

    SOURCES are directories of files (grouped into samples by key: a/x.jpg + a/x.json is
    sample a/x; field names are lower case), JSONL files (.jsonl, .jsonl.zst, .jsonl.gz,
    .json.gz; one sample a line), Parquet or Arrow files (.parquet, .arrow; one sample a
    row; needs shardkit[parquet]) or tar shards to re-shard (brace patterns like
    data-{000000..000099}.tar work).

    A build that stops leaves a manifest marked incomplete (verify fails on it, readers
    refuse it): finish it with --resume, or start over with --overwrite.

    -o s3://bucket/prefix/ (gs://, az://) builds in the store, with no local copy: each
    shard appears only whole, --workers write their shards under names of their own
    (PREFIX-w0001-000000.tar) and the manifest goes last, listing only whole objects;
    --resume goes on from the shards whose size and ETag match what was recorded;
    --overwrite deletes the old data set's manifest first, then its objects. Lock objects
    created with a conditional put keep a second build of the same prefix and part out.
    """
    config = BuildConfig(
        prefix=prefix,
        maxsize=maxsize,
        maxcount=maxcount,
        max_member=max_member,
        max_record=max_record,
        check_images=check_images,
        tar_policy=tar_policy,
        checksum=checksum,
        compress=compress,
        workers=workers,
        part=part,
        resume=resume,
        source_type=source_type,
        fields=fields,
        key_field=key_field,
        overwrite=overwrite,
        on_error=on_error,
        tree=TreeOptions(include, exclude, require_fields),
        image=ImageOptions(resize, reencode, quality) if resize or reencode else None,
    )
    try:
        plan = plan_build(list(sources), out_dir, config)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    for note in plan.notes:
        click.echo(f"note: {note}", err=True)
    try:
        result = _run(plan, progress)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: {_how_to_resume(plan)}", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        _report(result)
