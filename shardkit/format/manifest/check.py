"""Validation of manifest data: every rule a loaded manifest must pass.

The functions take parsed JSON (or CSV rows) and raise :class:`ManifestError` naming the
manifest, the entry (and CSV line) and the field. ``manifests/manifest.schema.json`` says
the same in JSON Schema; the cross-entry rules (one algorithm, no url twice, totals that
add up) are checked here only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from shardkit.errors import ConfigError, ManifestError
from shardkit.format.checksum import ALGORITHMS, split_checksum
from shardkit.format.pieces import Pieces
from shardkit.urls import REMOTE_PREFIXES, names_host

__all__ = [
    "CSV_HEADER",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_COUNT",
    "check_entry",
    "check_fields",
    "check_shards",
    "check_top",
    "csv_entry",
    "is_count",
    "normalize_url",
    "parse_int",
]

_MAX_DIGITS = 20  # a count or size with more digits is not one (2**64 has 20)
MAX_COUNT = 10**_MAX_DIGITS - 1  # the largest count a manifest holds
FORMAT_NAME = "shardkit.manifest"
FORMAT_VERSION = 1
CSV_HEADER = ("url", "size", "nsamples", "checksum")


def csv_entry(row: list[str], source: str | None, i: int, line: int) -> dict[str, Any]:
    """Validate one CSV data row (at ``line``) as entry ``i``."""
    if len(row) != len(CSV_HEADER):
        raise ManifestError(
            f"line {line}: expected {len(CSV_HEADER)} columns, got {len(row)}",
            path=source,
            entry=i,
        )
    raw: dict[str, Any] = dict(zip(CSV_HEADER, row, strict=True))
    for name in ("size", "nsamples"):
        text = raw[name].strip()
        if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
            raise ManifestError(
                f"line {line}: must be a non-negative integer, got {_short(raw[name])}",
                path=source,
                entry=i,
                field=name,
            )
        raw[name] = int(text)
    return check_entry(raw, source, i, line=line)


_ENTRY_KEYS = frozenset(
    {"url", "size", "nsamples", "checksum", "index", "index_checksum", "pieces"}
)
_TOP_KEYS = frozenset(
    {
        "format",
        "version",
        "checksum_algorithm",
        "total_samples",
        "total_bytes",
        "fields",
        "created",
        "part",
        "origins",
        "shards",
    }
)


class BigNumber(str):
    """A JSON integer too long to be a count, kept as its text (see :func:`parse_int`)."""

    def __repr__(self) -> str:
        return f"<an integer of {len(self)} digits>"


def parse_int(text: str) -> int | BigNumber:
    """``json.loads``' integer hook: a number of more digits than any count stays text,
    so a 5,000-digit value fails validation naming its entry and field, not as a
    traceback from Python's int-conversion limit."""
    return BigNumber(text) if len(text.lstrip("-")) > _MAX_DIGITS else int(text)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_entry(raw: Any, path: str | None, i: int, *, line: int | None = None) -> dict[str, Any]:
    """Validate one shard entry; errors name entry ``i`` (and the CSV ``line``)."""

    def bad(msg: str, name: str | None = None) -> ManifestError:
        return ManifestError(f"line {line}: {msg}" if line else msg, path=path, entry=i, field=name)

    if not isinstance(raw, dict):
        raise bad("shard entry must be an object")
    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}")
    for name in ("url", "checksum"):
        v = raw.get(name)
        if not isinstance(v, str) or not v or "\0" in v:
            raise bad(f"missing or not a non-empty string: {v!r}", name)
    for name in ("size", "nsamples"):
        v = raw.get(name)
        if not is_count(v):
            raise bad(f"must be a non-negative integer, got {_short(v)}", name)
    try:
        split_checksum(raw["checksum"])
    except ConfigError as exc:
        raise bad(str(exc), "checksum") from None
    index = raw.get("index")
    if index is not None and (not isinstance(index, str) or not index or "\0" in index):
        raise bad(f"must be a non-empty string, got {index!r}", "index")
    index_checksum = raw.get("index_checksum")
    if index_checksum is not None:
        if index is None:
            raise bad("is given without an index", "index_checksum")
        try:
            split_checksum(index_checksum)
        except (ConfigError, TypeError, AttributeError):
            msg = f"must look like 'sha256:<hex>', got {index_checksum!r}"
            raise bad(msg, "index_checksum") from None
    pieces = None
    if raw.get("pieces") is not None:
        try:
            pieces = Pieces.from_raw(raw["pieces"], raw["size"])
        except ConfigError as exc:
            raise bad(str(exc), "pieces") from None
    return {k: raw[k] for k in ("url", "size", "nsamples", "checksum")} | {
        "index": index,
        "index_checksum": index_checksum,
        "pieces": pieces,
    }


def check_fields(raw: Any, path: str | None) -> dict[str, dict[str, int]]:
    if not isinstance(raw, dict):
        raise ManifestError("must be an object", path=path, field="fields")
    for name, st in raw.items():
        if not (
            isinstance(st, dict)
            and set(st) == {"count", "bytes"}
            and all(is_count(v) for v in st.values())
        ):
            raise ManifestError(
                f"field {name!r} must be {{'count': n, 'bytes': n}}, got {st!r}",
                path=path,
                field="fields",
            )
    return {k: dict(v) for k, v in raw.items()}


def check_top(raw: dict[str, Any], path: str | None) -> None:
    """Validate everything but the shard list and the fields."""
    if raw.get("format") != FORMAT_NAME:
        raise ManifestError(
            f"not a shardkit manifest (format={raw.get('format')!r})", path=path, field="format"
        )
    version = raw.get("version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ManifestError(
            f"manifest version {version!r} is not supported (this shardkit reads "
            f"version {FORMAT_VERSION}); upgrade shardkit",
            path=path,
            field="version",
        )
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ManifestError(f"unknown keys {sorted(unknown)}", path=path)
    algo = raw.get("checksum_algorithm", "sha256")
    if algo not in ALGORITHMS:
        raise ManifestError(
            f"unknown checksum algorithm {algo!r}", path=path, field="checksum_algorithm"
        )
    for name in ("total_samples", "total_bytes"):
        if name in raw and not is_count(raw[name]):
            raise ManifestError(
                f"must be a non-negative integer, got {_short(raw[name])}", path=path, field=name
            )
    if not isinstance(raw.get("created", {}), dict):
        raise ManifestError("must be an object", path=path, field="created")
    origins = raw.get("origins", [])
    if not (
        isinstance(origins, list)
        and all(isinstance(o, str) and o.startswith(REMOTE_PREFIXES) for o in origins)
    ):
        raise ManifestError(
            "must be a list of http(s):// or s3:// url prefixes", path=path, field="origins"
        )
    hostless = next((o for o in origins if not names_host(o)), None)
    if hostless is not None:  # "http://" alone would grant every host
        raise ManifestError(
            f"origin {hostless!r} names no host (or bucket): give the whole prefix, "
            "e.g. https://data.example.org/shards/",
            path=path,
            field="origins",
        )
    part = raw.get("part")
    if part is not None and not (
        isinstance(part, dict)
        and set(part) == {"index", "count"}
        and is_count(part["index"])
        and is_count(part["count"])
        and part["index"] < part["count"]
    ):
        raise ManifestError(
            f"must be {{'index': i, 'count': n}} with 0 <= i < n, got {part!r}",
            path=path,
            field="part",
        )


def check_shards(
    shards: Sequence[dict[str, Any]], path: str | None, algo: str, lines: list[int] | None = None
) -> None:
    """Cross-entry rules: one checksum algorithm, no url listed twice."""
    seen: dict[str, int] = {}
    for i, s in enumerate(shards):
        where = f"line {lines[i]}: " if lines else ""
        url, checksum = normalize_url(s["url"]), s["checksum"]
        if not checksum.startswith(algo + ":"):
            raise ManifestError(
                f"{where}checksum {checksum[:20]}... is not {algo}",
                path=path,
                entry=i,
                field="checksum",
            )
        if url in seen:
            raise ManifestError(
                f"{where}url {s['url']!r} is listed twice (also entry {seen[url]}, "
                f"{shards[seen[url]]['url']!r})",
                path=path,
                entry=i,
                field="url",
            )
        seen[url] = i


def normalize_url(url: str) -> str:
    """One spelling per shard: ``./a.tar``, ``x/../a.tar`` and ``a.tar`` are one url.

    The path is normalised (``.``, ``..``, doubled slashes); a scheme and host are
    lower-cased. Percent-escapes are left alone (a local file name may hold a ``%``).
    Used to find a shard listed twice.
    """
    if "://" in url:
        parts = urlsplit(url)
        path = posixpath.normpath(parts.path or "/")
        return parts._replace(
            scheme=parts.scheme.lower(), netloc=parts.netloc.lower(), path=path
        ).geturl()
    if url.startswith("pipe:"):
        return url
    return posixpath.normpath(url)
