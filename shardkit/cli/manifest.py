"""``shardkit manifest``: make a manifest for existing shards, merge parts, export CSV."""

from __future__ import annotations

import json
import os
import posixpath
import re

import click
from tqdm import tqdm

from shardkit.cache import make_opener
from shardkit.check.adopt import adopt_remote, is_remote_pattern
from shardkit.check.summary import manifest_from_shards
from shardkit.cli.build import tar_policy_option
from shardkit.errors import ConfigError, redact
from shardkit.format.checksum import ALGORITHMS
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest
from shardkit.format.pieces import DEFAULT_PIECE_SIZE
from shardkit.io.store_base import is_object_url
from shardkit.units import format_bytes, parse_size
from shardkit.urls import expand_braces
from shardkit.write.build.merge import keep_other_set, merge_object_parts, merge_parts
from shardkit.write.inputs.discover import discover
from shardkit.write.writer.where import open_target

__all__ = ["command"]

_FILES = (".json", ".csv")  # an -o naming a manifest file, not a directory


@click.group("manifest")
def command() -> None:
    """Make, merge and export shard manifests."""


def _local_out(out: str, what: str) -> None:
    """``-o`` of a command that writes only locally: a url is an error saying what does
    stream into an object store, never a folder named after the scheme."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", out):
        hint = "sk.ShardWriter(url) streams shards into s3://, gs:// and az:// today; "
        raise ConfigError(
            f"{redact(out)!r}: {what} writes to a local directory "
            f"({hint if is_object_url(out) else ''}write locally and copy, "
            "or use a shared file system)"
        )


def _echo_manifest(m: Manifest, path: str, as_json: bool, what: str) -> None:
    if as_json:
        d = {"manifest": path, "shards": len(m), "samples": m.total_samples, "bytes": m.total_bytes}
        click.echo(json.dumps(d))
    else:
        click.echo(
            f"{what} {path}: {len(m)} shards, {m.total_samples:,} samples, "
            f"{format_bytes(m.total_bytes)}"
        )


@command.command("from-shards")
@click.argument("source", metavar="DIR_OR_PATTERN")
@click.option(
    "-o",
    "--out",
    "out_path",
    type=click.Path(),
    help="Manifest to write, or a directory for it (default: manifest.json in DIR or the "
    "shards' directory; required for remote shards). For shards in an object store it may "
    "be an s3://, gs:// or az:// url: the manifest and indexes go there.",
)
@click.option("--checksum", type=click.Choice(ALGORITHMS), default="sha256", show_default=True)
@click.option(
    "--index/--no-index",
    default=True,
    show_default=True,
    help="Write a sample index for each shard (.index/NAME.idx beside it).",
)
@click.option(
    "--piece-size",
    default=str(DEFAULT_PIECE_SIZE),
    show_default=True,
    help="Bytes per piece of the per-piece checksums a cache verifies (0: none).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Remote shards read at a time.",
)
@tar_policy_option
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace a manifest at -o that lists other shards (another data set).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def from_shards(source: str, out_path: str | None, checksum: str, index: bool, piece_size: str,
                workers: int, tar_policy: str, overwrite: bool, as_json: bool,
                progress: bool) -> None:  # fmt: skip
    """Write a manifest for shards someone else wrote (webdataset, GNU tar, ...).

    Each shard is read once: checksum, sample count and sample offsets in one pass.
    DIR_OR_PATTERN may be remote ('https://host/d/x-{000000..000999}.tar', s3://...):
    the shards stay there, and -o DIR gets the manifest and the sample indexes; -o
    s3://b/d/ (gs://, az://) puts them into the store, listing shards under it relative
    to the manifest. With --tar-policy lenient, links, devices, FIFOs and unknown member
    types are skipped (each shard's count warned): read the shards with the same policy.
    """
    if out_path is not None and is_object_url(out_path) and not is_remote_pattern(source):
        raise click.UsageError(
            f"{out_path}: a manifest in an object store is for shards there: upload the "
            "shards first (or build them there: shardkit build ... -o URL)"
        )
    if out_path is not None and not is_object_url(out_path):
        _local_out(out_path, "manifest from-shards -o")
    if is_remote_pattern(source):
        _adopt(source, out_path, (checksum, index, piece_size, workers, tar_policy), overwrite,
               as_json, progress)  # fmt: skip
        return
    if out_path is not None and (os.path.isdir(out_path) or not out_path.endswith(_FILES)):
        out_path = os.path.join(out_path, "manifest.json")
    try:
        pieces = parse_size(piece_size)
        total = sum(u.size for u in discover([source], source_type="tar"))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="scan",
               disable=None if progress else True)  # fmt: skip
    with bar:
        m, path = manifest_from_shards(
            source,
            manifest_path=out_path,
            algo=checksum,
            index=index,
            progress=bar.update,
            piece_size=pieces or None,
            tar_policy=tar_policy,
        )
    keep_other_set(open_target(*os.path.split(os.path.abspath(path))), m, overwrite)
    save_manifest(m, path)  # and its compact form beside it
    _echo_manifest(m, path, as_json, "wrote")


def _adopt(source: str, out_path: str | None, how: tuple[str, bool, str, int, str],
           overwrite: bool, as_json: bool, progress: bool) -> None:  # fmt: skip
    checksum, index, piece_size, workers, tar_policy = how
    if out_path is None:
        raise click.UsageError("remote shards need -o DIR for the manifest and indexes")
    out_dir = posixpath.dirname(out_path) if out_path.endswith(_FILES) else out_path
    try:
        pieces = parse_size(piece_size)
        n = len(expand_braces(source))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    bar = tqdm(total=n, unit="shard", desc="adopt", disable=None if progress else True)
    got = [0]

    def seen(nbytes: int) -> None:
        got[0] += nbytes
        bar.set_postfix_str(format_bytes(got[0]), refresh=False)

    with bar:
        try:
            m, path = adopt_remote(source, out_dir or ".", make_opener(), algo=checksum,
                                   index=index, piece_size=pieces or None, workers=workers,
                                   progress=seen, on_shard=lambda: bar.update(1),
                                   tar_policy=tar_policy)  # fmt: skip
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
    if out_path.endswith(_FILES):
        path = out_path
    head, name = posixpath.split(path)
    target = open_target(head or ".", name)
    keep_other_set(target, m, overwrite)
    # with its CSV; locally its compact form too (in a store each node builds that itself)
    target.write_manifest(m)
    _echo_manifest(m, path, as_json, "wrote")


@command.command("merge")
@click.argument("parts", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    "out_path",
    required=True,
    help="The merged manifest to write (a path, or an s3://, gs://, az:// url).",
)
@click.option("--allow-incomplete", is_flag=True, help="Merge even when some parts are missing.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace a manifest at -o that lists other shards (another data set).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def merge(
    parts: tuple[str, ...], out_path: str, allow_incomplete: bool, overwrite: bool, as_json: bool
) -> None:
    """Join the partial manifests of `shardkit build --part I/N` into one.

    Parts in an object store (the manifests of ShardWriter("s3://b/set/part-0007/",
    part=(7, 64)) tasks; brace patterns expand) merge into a manifest in the same store.
    """
    if is_object_url(out_path):
        urls = [u for p in parts for u in expand_braces(p)]
        if not all(is_object_url(u) for u in urls):
            raise click.UsageError("a merged manifest in an object store takes parts there too")
        m = merge_object_parts(
            urls, out_path, allow_incomplete=allow_incomplete, overwrite=overwrite
        )
        _echo_manifest(m, out_path, as_json, "merged")
        return
    _local_out(out_path, "manifest merge -o")
    for p in parts:
        if not os.path.isfile(p):
            raise click.BadParameter(f"File {p!r} does not exist.", param_hint="PARTS...")
    m = merge_parts(list(parts), out_path, allow_incomplete=allow_incomplete, overwrite=overwrite)
    _echo_manifest(m, os.path.abspath(out_path), as_json, "merged")
    info = m.created.get("build") or {}
    if info.get("skipped_records") and not as_json:
        report = os.path.join(os.path.dirname(os.path.abspath(out_path)), info["errors"])
        click.echo(f"the parts skipped {info['skipped_records']:,} bad records: named in {report}")


@command.command("to-csv")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o",
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="CSV to write ('-': stdout; default: beside the manifest).",
)
def to_csv(manifest: str, out_path: str | None) -> None:
    """Export a manifest as CSV: url,size,nsamples,checksum."""
    m = Manifest.load(manifest)
    if out_path == "-":
        click.echo(m.to_csv(), nl=False)
        return
    path = out_path or os.path.splitext(manifest)[0] + ".csv"
    m.save(path)
    click.echo(f"wrote {path}: {len(m)} shards")
