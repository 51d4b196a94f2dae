"""Which files of a folder become samples: ``--include``/``--exclude`` patterns, and the
fields every sample must have (``--require-fields jpg;png,json``).

Patterns are shell globs matched case-insensitively against the path relative to the
source directory; a pattern without ``/`` also matches the file's base name
(``--exclude '*.md'`` drops ``README.md`` at any depth).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.errors import ConfigError
from shardkit.format.images import IMAGE_EXTS
from shardkit.units import plural

__all__ = [
    "TreeOptions",
    "check_required",
    "group_samples",
    "image_mix_note",
    "parse_require",
    "select_files",
]


@dataclass(frozen=True)
class TreeOptions:
    """File selection for folder sources.

    Args:
        include: keep only files matching one of these globs (empty: every file).
        exclude: drop files matching any of these globs.
        require: field groups every sample must have; a group is alternatives
            (``(("jpg", "png"), ("json",))``: an image in jpg or png, and a json).
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    require: tuple[tuple[str, ...], ...] = ()


def parse_require(spec: str) -> tuple[tuple[str, ...], ...]:
    """``"jpg;png,json"`` → ``(("jpg", "png"), ("json",))`` (``,`` and, ``;`` or)."""
    groups = []
    for part in spec.split(","):
        alts = tuple(a.strip().lower() for a in part.split(";") if a.strip())
        if not alts:
            raise ConfigError(f"--require-fields wants FIELD[;ALT],FIELD..., got {spec!r}")
        groups.append(alts)
    return tuple(groups)


def _matches(rel: str, pattern: str) -> bool:
    rel, pattern = rel.lower(), pattern.lower()
    if fnmatch.fnmatchcase(rel, pattern):
        return True
    return "/" not in pattern and fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)


def select_files(files: Sequence[str], opts: TreeOptions) -> list[str]:
    """The files (relative posix paths) that ``opts`` keeps, in order."""
    return [
        f
        for f in files
        if (not opts.include or any(_matches(f, p) for p in opts.include))
        and not any(_matches(f, p) for p in opts.exclude)
    ]


def check_required(
    samples: Sequence[tuple[str, Sequence[str]]], require: Sequence[Sequence[str]]
) -> list[str]:
    """The keys of ``(key, fields)`` samples that lack a required field group."""
    bad = []
    for key, fields in samples:
        have = set(fields)
        if any(not have.intersection(group) for group in require):
            bad.append(key)
    return bad


def image_mix_note(samples: Sequence[tuple[str, Sequence[str]]]) -> str | None:
    """A note when samples store their image in different formats (jpg here, png there)."""
    kinds: Counter[str] = Counter()
    for _, fields in samples:
        images = sorted(f for f in fields if "." not in f and f in IMAGE_EXTS)
        if images:
            kinds["/".join(images)] += 1
    if len(kinds) < 2:
        return None
    mix = ", ".join(f"{k} ({n:,})" for k, n in kinds.most_common())
    return (
        f"samples store images in different formats: {mix}; readers that expect one "
        "field name break on the others (--require-fields, --exclude or --reencode jpg "
        "makes them one)"
    )


def _stored_field(field: str, reencode: str | None) -> str:
    """The field name a file's field is stored under: lower case, re-encoded images renamed."""
    low = field.lower()
    head, _, ext = low.rpartition(".")
    if reencode is not None and ext in IMAGE_EXTS:
        return f"{head}.{reencode}" if head else reencode
    return low


def group_samples(
    root: str,
    keyed: Sequence[tuple[str, str, str]],
    opts: TreeOptions,
    *,
    reencode: str | None = None,
    skip_bad: bool = False,
    notes: list[str] | None = None,
    skipped: list[tuple[str, tuple[tuple[str, str], ...], str]] | None = None,
) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Group ``(key, field, rel)`` files into samples ``(key, ((field, rel), ...))``.

    Field names are stored lower case (``IMG.JPG`` is field ``jpg``, with a note), two
    files of one sample with the same stored field are refused, and samples missing a
    required field are refused (or left out with a note when ``skip_bad``; each left-out
    sample is appended to ``skipped`` as ``(key, members, reason)``).
    """
    groups: dict[str, dict[str, str]] = {}
    upper: list[str] = []
    for key, field, rel in keyed:
        stored = _stored_field(field, reencode)
        if stored != field and field.lower() == stored:
            upper.append(rel)
        members = groups.setdefault(key, {})
        if stored in members:
            raise ConfigError(
                f"{root}: sample {key!r} has two files for field {stored!r}: "
                f"{members[stored]} and {rel} (fields are case-insensitive"
                + (f"; --reencode {reencode} stores every image as {reencode}" if reencode else "")
                + ")"
            )
        members[stored] = rel
    samples = [(k, tuple(sorted(groups[k].items()))) for k in sorted(groups)]
    if upper and notes is not None:
        notes.append(
            f"{root}: {plural(len(upper), 'file')} with upper-case extensions (e.g. {upper[0]}); "
            "their fields are stored in lower case, as readers look them up"
        )
    if opts.require:
        bad = set(check_required([(k, [f for f, _ in m]) for k, m in samples], opts.require))
        if bad:
            want = ", ".join("|".join(g) for g in opts.require)
            first = [k for k, _ in samples if k in bad][:3]
            shown = "; ".join(f"{k} has {', '.join(f for f, _ in dict(samples)[k])}" for k in first)
            if not skip_bad:
                raise ConfigError(
                    f"{root}: {plural(len(bad), 'sample')} without a required field ({want}): "
                    f"{shown}; "
                    "narrow the input with --include/--exclude, or pass --on-error skip "
                    "to leave them out"
                )
            if skipped is not None:
                for k, m in samples:
                    if k in bad:
                        has = ", ".join(f for f, _ in m)
                        skipped.append((k, m, f"lacks a required field ({want}); has {has}"))
            samples = [s for s in samples if s[0] not in bad]
            if notes is not None:
                left = plural(len(bad), "sample")
                notes.append(f"{root}: left out {left} without {want}: {shown}")
    elif notes is not None:
        note = image_mix_note([(k, [f for f, _ in m]) for k, m in samples])
        if note:
            notes.append(f"{root}: {note}")
    return samples
