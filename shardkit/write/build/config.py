"""The options, plan and result of a build (see :mod:`shardkit.write.build`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ConfigError
from shardkit.format.images import REENCODE_FORMATS, ImageOptions
from shardkit.format.manifest.check import MAX_COUNT
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.buffer import DEFAULT_MAX_MEMBER
from shardkit.format.tario.members import TAR_POLICIES
from shardkit.units import parse_size
from shardkit.values import as_int
from shardkit.write.inputs.image_check import CHECK_IMAGES
from shardkit.write.inputs.select import TreeOptions
from shardkit.write.inputs.sources import DEFAULT_MAX_RECORD, ON_ERROR, FieldMap, Unit
from shardkit.write.writer import WriterOptions
from shardkit.write.writer.target import Target, build_info

__all__ = ["BuildConfig", "BuildPlan", "BuildResult", "check_config", "manifest_name"]


@dataclass(frozen=True)
class BuildConfig:
    """The options of a build (the ``shardkit build`` flags).

    Args:
        prefix: shard names are ``{prefix}-{index:06d}.tar``.
        maxsize: roll over to a new shard before its tar would pass this many bytes
            (``"1GB"``; uncompressed: a compressed shard is smaller on disk).
        maxcount: roll over after this many samples (None: no limit).
        checksum: ``sha256`` or another algorithm of :mod:`shardkit.format.checksum`.
        compress: None, ``"zstd"`` or ``"gzip"``.
        workers: parallel writer processes; None picks a count from the input size (one
            per 256 MB, at most the CPU count). The output is the same for a given count.
        part: ``(i, n)``: build only part i of n.
        resume: continue an interrupted build in the same directory.
        source_type: how directories are read: ``auto``, ``files``, ``jsonl``, ``tar``.
        fields: JSONL record fields mapped to their own members (``--field``).
        key_field: the JSONL record field that holds the sample key.
        overwrite: delete what an earlier build left in the output (its manifest,
            shards, indexes, work directory) and build from scratch.
        on_error: ``raise`` (default) stops at the first bad record; ``skip`` leaves bad
            records out, names each in ``manifest.errors.jsonl`` and finishes.
        tree: which files of a folder become samples (include, exclude, required fields).
        image: resize / re-encode the images of folder sources.
        fn: a build function: ``fn(input)`` yields the samples of one input (see
            :func:`build`); the sources are then its inputs.
        max_record: the largest JSONL line or Parquet/Arrow row (bytes, 256 MiB by
            default), checked while it is read: a longer one is a bad record (skipped
            and reported with ``on_error="skip"``), never held whole.
        check_images: image fields checked as they are read, of folder and Parquet/Arrow
            sources alike: ``header`` (default: readable header, not truncated),
            ``decode`` (decoded whole) or ``off``; a bad image is a bad record (skipped
            and reported with ``on_error="skip"``).
        max_member: the largest member (bytes) of a tar input held in memory when
            re-sharding (1 GiB by default); a larger one is a ``ShardFormatError``.
        tar_policy: how tar inputs are read: ``"strict"`` (default) refuses a link,
            device, FIFO or unknown member type naming the input and offset; ``"lenient"``
            skips such members, counted and warned naming the input.
    """

    prefix: str = "data"
    maxsize: int | str = "1GB"
    maxcount: int | None = None
    checksum: str = "sha256"
    compress: str | None = None
    workers: int | None = 1
    part: tuple[int, int] | None = None
    resume: bool = False
    source_type: str = "auto"
    fields: tuple[FieldMap, ...] = ()
    key_field: str | None = None
    overwrite: bool = False
    on_error: str = "raise"
    tree: TreeOptions = dataclasses.field(default_factory=TreeOptions)
    image: ImageOptions | None = None
    fn: Callable[[Any], Iterable[Mapping[str, Any]]] | None = None
    max_member: int | str = DEFAULT_MAX_MEMBER
    max_record: int | str = DEFAULT_MAX_RECORD
    check_images: str = "header"
    tar_policy: str = "strict"


def manifest_name(part: tuple[int, int] | None) -> str:
    """A build's manifest: ``manifest.json``, or a part's ``manifest.part-I-of-N.json``."""
    return "manifest.json" if part is None else f"manifest.part-{part[0]:04d}-of-{part[1]:04d}.json"


@dataclass(frozen=True)
class BuildPlan:
    """What :func:`run_build` will do: the units of this part, split between workers, and
    the target (a folder or an object-store prefix) chosen once where the output arrived."""

    target: Target
    config: BuildConfig
    units: tuple[Unit, ...]
    groups: tuple[range, ...]
    fingerprint: str
    done: Manifest | None = None  # the output is already this build, finished
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the fingerprint covers
    notes: tuple[str, ...] = ()  # things the user should hear (case-folded fields, ...)

    @property
    def meta(self) -> dict[str, Any]:
        """The build's facts its manifest keeps (``created.build``): fingerprint, options,
        inputs, so a later run can say what differs."""
        return {
            "config": self.fingerprint,
            "options": self.options,
            "inputs": {"units": len(self.units), "bytes": self.total_bytes},
        }

    @property
    def total_bytes(self) -> int:
        """Input bytes of this part (what a progress bar counts to)."""
        return sum(u.size for u in self.units)

    @property
    def shard_prefix(self) -> str:
        part = self.config.part
        return self.config.prefix if part is None else f"{self.config.prefix}-p{part[0]:04d}"

    @property
    def out_dir(self) -> str:
        """The output: a folder's absolute path or a prefix's url (no trailing ``/``)."""
        return self.target.base

    @property
    def manifest_name(self) -> str:
        return self.target.manifest_name

    @property
    def manifest_path(self) -> str:
        return f"{self.out_dir}/{self.manifest_name}"

    @property
    def work_stem(self) -> str:
        """The name of a parallel build's work (``.{stem}/`` locally, ``.{stem}-*``
        objects in a store)."""
        return f"{self.shard_prefix}.work"


@dataclass(frozen=True)
class BuildResult:
    """What a build did: the manifest, samples written now and kept from before, time."""

    manifest: Manifest
    manifest_path: str
    samples: int
    resumed_samples: int
    input_bytes: int
    seconds: float
    workers: int
    nothing_to_do: bool = False  # the output already was a finished build of these inputs

    def to_dict(self) -> dict[str, Any]:
        secs = max(self.seconds, 1e-9)
        return {
            "manifest": self.manifest_path,
            "shards": len(self.manifest),
            "samples": self.manifest.total_samples,
            "bytes": self.manifest.total_bytes,
            "written_samples": self.samples,
            "resumed_samples": self.resumed_samples,
            "input_bytes": self.input_bytes,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples / secs, 1),
            "mb_per_s": round(self.input_bytes / secs / 1e6, 2),
            "workers": self.workers,
            "nothing_to_do": self.nothing_to_do,
            "skipped_records": int(build_info(self.manifest).get("skipped_records") or 0),
            "part": list(self.manifest.part.values()) if self.manifest.part else None,
        }


def check_config(c: BuildConfig) -> None:
    """Refuse bad options with a :class:`ConfigError` saying which and why."""
    if not c.prefix or "/" in c.prefix or c.prefix.startswith(".") or "{" in c.prefix:
        raise ConfigError(f"bad shard prefix {c.prefix!r}")
    quality = c.image.quality if c.image is not None else WriterOptions.image_quality
    # the options every worker's writer takes, checked as it checks them, before any output
    WriterOptions(
        prefix=c.prefix,
        maxsize=c.maxsize,
        maxcount=c.maxcount,
        checksum=c.checksum,
        compress=c.compress,
        image_quality=quality,
    )
    if parse_size(c.max_member) < 1:
        raise ConfigError(f"max_member must be at least 1 byte, got {c.max_member!r}")
    if parse_size(c.max_record) < 1:
        raise ConfigError(f"max_record must be at least 1 byte, got {c.max_record!r}")
    if c.workers is not None:
        as_int(c.workers, "workers", low=1, floats=False)
    if c.part is not None and not (0 <= c.part[0] < c.part[1]):
        raise ConfigError(f"part must be I/N with 0 <= I < N, got {c.part[0]}/{c.part[1]}")
    if c.part is not None and c.part[1] > MAX_COUNT:
        raise ConfigError(f"part count {c.part[1]} is more than a manifest holds ({MAX_COUNT})")
    if c.resume and c.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: pick one")
    if c.tar_policy not in TAR_POLICIES:
        raise ConfigError(f"tar_policy must be one of {', '.join(TAR_POLICIES)}")
    if c.check_images not in CHECK_IMAGES:
        raise ConfigError(f"check_images must be one of {', '.join(CHECK_IMAGES)}")
    if c.on_error not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}, got {c.on_error!r}")
    if c.image is not None:
        if c.image.reencode is not None and c.image.reencode not in REENCODE_FORMATS:
            raise ConfigError(f"reencode must be one of {', '.join(REENCODE_FORMATS)}")
        if c.image.maxside is not None:
            as_int(c.image.maxside, "image maxside", low=1, floats=False)
