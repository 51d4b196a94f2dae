"""``shardkit verify MANIFEST``: check shards against their manifest.

Exit codes: 0 every shard is good, 1 problems found (each printed with the shard, what is
wrong, expected and found; a manifest that cannot be read is one), 2 usage.
"""

from __future__ import annotations

import json
import threading

import click
from tqdm import tqdm

from shardkit.cache import make_opener
from shardkit.check.report import Problem, VerifyReport
from shardkit.check.verify import verify
from shardkit.cli.build import tar_policy_option
from shardkit.errors import ShardkitError
from shardkit.io import load_manifest
from shardkit.units import format_bytes, plural

__all__ = ["command"]


def _summary(report: VerifyReport) -> str:
    what = f"{plural(report.shards, 'shard')}, {format_bytes(report.bytes)}, level {report.level}"
    took = f"in {report.seconds:.2f} s"
    if report.ok:
        return f"OK: {what} {took}"
    if not report.problems:
        return f"FAILED: the manifest is incomplete ({what}) {took}"
    problems = plural(len(report.problems), "problem")
    bad = f"{len(report.bad_shards)} of {plural(report.shards, 'shard')}"
    return f"FAILED: {problems} in {bad} ({what}) {took}"


def _unreadable(manifest: str, level: str, exc: BaseException, as_json: bool) -> None:
    """A manifest that cannot be read is a problem found: one line, or a JSON report."""
    if not as_json:
        click.echo(f"error: cannot read manifest: {exc}", err=True)
        return
    problem = Problem(manifest, "manifest", f"cannot read manifest: {exc}")
    report = VerifyReport(manifest=manifest, level=level, shards=0, bytes=0, problems=[problem])
    click.echo(json.dumps(report.to_dict(), indent=1))


@click.command("verify")
@click.argument("manifest")
@click.option(
    "--quick", "level", flag_value="quick", help="Only check each shard exists and its size."
)
@click.option(
    "--deep",
    "level",
    flag_value="deep",
    help="Also parse every shard: sample count, sample index, hostile members.",
)
@click.option(
    "--decode",
    "level",
    flag_value="decode",
    help="--deep, and decode every image, npy, json and text field (names the bad sample).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Shards checked in parallel.",
)
@tar_policy_option
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON report.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on stderr (default: when stderr is a terminal).",
)
def command(
    manifest: str,
    level: str | None,
    jobs: int,
    tar_policy: str,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Check the shards MANIFEST lists: existence and size (--quick), checksums and sample
    index files (default), or a full parse of every shard (--deep). Exit 0 when all is
    good, 1 when problems were found (an unreadable manifest is one), 2 on a usage error.
    With --tar-policy lenient a deep parse skips links, devices, FIFOs and unknown member
    types, each shard's count warned (and in --json's skipped_members).
    """
    ctx = click.get_current_context()
    opener = make_opener()
    try:
        m = load_manifest(manifest, opener)
    except (ShardkitError, OSError) as exc:
        _unreadable(manifest, level or "checksum", exc, as_json)
        ctx.exit(1)
    level = level or "checksum"
    lock = threading.Lock()
    bar = tqdm(
        total=m.total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc=f"verify ({level})",
        disable=None if progress is None else not progress,
        leave=False,
    )

    def advance(n: int) -> None:
        with lock:
            bar.update(n)

    try:
        report = verify(
            m,
            level=level,
            jobs=jobs,
            opener=opener,
            progress=advance,
            source=manifest,
            tar_policy=tar_policy,
        )
    finally:
        bar.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        for p in report.problems:
            click.echo(f"FAIL {p}")
        if report.incomplete:
            click.echo(f"FAIL {report.manifest}: {report.incomplete}")
        for w in report.warnings:
            click.echo(f"warning: {w}", err=True)
        click.echo(_summary(report))
    ctx.exit(0 if report.ok else 1)
