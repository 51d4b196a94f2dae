"""The checksum manifest: which shards a data set has, their sizes, sample counts, checksums.

JSON (versioned; the schema is ``manifests/manifest.schema.json``) with a CSV export of
``url,size,nsamples,checksum``. Shard urls are relative to the manifest's location unless
absolute; :meth:`Manifest.resolve` refuses ``pipe:`` urls and urls outside the manifest's
base unless the caller allows them in code.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardkit._version import __version__
from shardkit.durable import atomic_write, open_regular
from shardkit.errors import ConfigError, ManifestError
from shardkit.format.checksum import split_checksum
from shardkit.format.manifest.check import (
    CSV_HEADER,
    FORMAT_NAME,
    FORMAT_VERSION,
    check_entry,
    check_fields,
    check_shards,
    check_top,
    csv_entry,
    normalize_url,
    parse_int,
)
from shardkit.format.pieces import Pieces
from shardkit.urls import dirname, is_absolute, join, resolve_url

__all__ = [
    "FieldStats",
    "Manifest",
    "ShardEntry",
    "add_fields",
    "creation_info",
    "incomplete_reason",
]

FieldStats = dict[str, dict[str, int]]
"""Per field name, ``{"count": samples having it, "bytes": total bytes}``."""


@dataclass(frozen=True)
class ShardEntry:
    """One shard: ``url`` (relative to the manifest unless absolute), its ``size`` in bytes,
    ``nsamples``, ``checksum`` as ``algo:hex`` and optionally the url of its sample index
    and that index file's checksum (which lets a node-local cache keep the index too), and
    optionally the checksums of its fixed-size ``pieces`` (:mod:`shardkit.format.pieces`).
    """

    url: str
    size: int
    nsamples: int
    checksum: str
    index: str | None = None
    index_checksum: str | None = None
    pieces: Pieces | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "url": self.url,
            "size": self.size,
            "nsamples": self.nsamples,
            "checksum": self.checksum,
        }
        if self.index is not None:
            d["index"] = self.index
        if self.index_checksum is not None:
            d["index_checksum"] = self.index_checksum
        if self.pieces is not None:
            d["pieces"] = self.pieces.to_dict()
        return d


@dataclass
class Manifest:
    """A data set's shard list and dataset-level facts.

    Args:
        shards: the shard entries, in order.
        checksum_algorithm: the algorithm every shard checksum uses.
        fields: per field name, ``{"count": samples having it, "bytes": total bytes}``.
        created: creation info (tool, version, time).
        part: ``{"index": i, "count": n}`` for a partial manifest of a partitioned build.
        base: where relative urls resolve from (the manifest's directory or url).
        origins: remote url prefixes an adopted data set's shards live under; honoured
            only for a manifest read from the local disk (see :mod:`shardkit.urls`).
    """

    shards: list[ShardEntry] = field(default_factory=list)
    checksum_algorithm: str = "sha256"
    fields: dict[str, dict[str, int]] = field(default_factory=dict)
    created: dict[str, Any] = field(default_factory=dict)
    part: dict[str, int] | None = None
    base: str | None = None
    origins: tuple[str, ...] = ()

    # -- facts ---------------------------------------------------------------------
    @property
    def total_samples(self) -> int:
        return sum(s.nsamples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Iterator[ShardEntry]:
        return iter(self.shards)

    # -- reading -------------------------------------------------------------------
    @classmethod
    def loads(cls, text: str | bytes, *, source: str | None = None) -> Manifest:
        """Parse manifest JSON (or CSV when ``source`` ends in ``.csv``)."""
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ManifestError(f"not UTF-8 at byte {exc.start}", path=source) from None
        if source is not None and source.lower().endswith(".csv"):
            return cls._from_csv(text, source)
        try:
            raw = json.loads(text, parse_int=parse_int)
        except json.JSONDecodeError as exc:
            raise ManifestError(
                f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                path=source,
            ) from None
        except RecursionError:
            raise ManifestError("not valid JSON: nested too deeply", path=source) from None
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: Any, *, source: str | None = None) -> Manifest:
        """Build a manifest from parsed JSON, checking every field (``ManifestError``)."""
        if not isinstance(raw, dict):
            raise ManifestError("top level must be an object", path=source)
        check_top(raw, source)
        algo = raw.get("checksum_algorithm", "sha256")
        shards_raw = raw.get("shards")
        if not isinstance(shards_raw, list):
            raise ManifestError("must be a list", path=source, field="shards")
        entries = [check_entry(e, source, i) for i, e in enumerate(shards_raw)]
        check_shards(entries, source, algo)
        shards = [ShardEntry(**e) for e in entries]
        for name, attr in (("total_samples", "nsamples"), ("total_bytes", "size")):
            want = sum(getattr(s, attr) for s in shards)
            if name in raw and raw[name] != want:
                raise ManifestError(
                    f"says {raw[name]!r} but the shards add up to {want}", path=source, field=name
                )
        part = raw.get("part")
        return cls(
            shards=shards,
            checksum_algorithm=algo,
            fields=check_fields(raw.get("fields", {}), source),
            created=dict(raw.get("created", {})),
            part=dict(part) if part is not None else None,
            base=dirname(source) if source else None,
            origins=tuple(raw.get("origins", ())),
        )

    @classmethod
    def _from_csv(cls, text: str, source: str | None) -> Manifest:
        rows = csv.reader(io.StringIO(text))
        entries: list[dict[str, Any]] = []
        lines: list[int] = []
        try:
            header = next(rows, None)
            if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
                raise ManifestError(
                    f"line 1: CSV header must be {','.join(CSV_HEADER)}", path=source
                )
            for row in rows:
                if row:
                    entries.append(csv_entry(row, source, len(entries), rows.line_num))
                    lines.append(rows.line_num)
        except csv.Error as exc:
            raise ManifestError(f"line {rows.line_num}: bad CSV: {exc}", path=source) from None
        algo = split_checksum(entries[0]["checksum"])[0] if entries else "sha256"
        check_shards(entries, source, algo, lines)
        shards = [ShardEntry(**e) for e in entries]
        return cls(shards=shards, checksum_algorithm=algo, base=dirname(source) if source else None)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a local manifest (``.json`` or ``.csv``)."""
        path = os.fspath(path)
        try:  # a FIFO or a device is refused by name, never waited on or read forever
            with open(open_regular(path), "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ManifestError(f"cannot read: {exc.strerror}", path=path) from exc
        return cls.loads(data, source=os.path.abspath(path))

    # -- writing -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "checksum_algorithm": self.checksum_algorithm,
            "total_samples": self.total_samples,
            "total_bytes": self.total_bytes,
            "fields": self.fields,
            "created": self.created,
        }
        if self.part is not None:
            d["part"] = self.part
        if self.origins:
            d["origins"] = list(self.origins)
        d["shards"] = [s.to_dict() for s in self.shards]
        return d

    def dumps(self) -> str:
        """The manifest as JSON text: one line per shard (json's C encoder writes each; an
        indented dump of 100,000 shards goes through its pure-Python one, 4x slower)."""
        d = self.to_dict()
        shards = d.pop("shards")
        head = json.dumps(d, indent=1, ensure_ascii=False)[:-2]  # without the closing "\n}"
        rows = ",\n  ".join(json.dumps(s, ensure_ascii=False) for s in shards)
        return head + ',\n "shards": [' + (f"\n  {rows}\n ]" if shards else "]") + "\n}\n"

    def to_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(CSV_HEADER)
        for s in self.shards:
            w.writerow([s.url, s.size, s.nsamples, s.checksum])
        return out.getvalue()

    def save(self, path: str | os.PathLike[str], *, csv_too: bool = True) -> None:
        """Write the manifest atomically (and ``manifest.csv`` beside it)."""
        path = os.fspath(path)
        if path.lower().endswith(".csv"):
            atomic_write(path, self.to_csv().encode())
            return
        if csv_too:
            atomic_write(os.path.splitext(path)[0] + ".csv", self.to_csv().encode())
        atomic_write(path, self.dumps().encode())

    # -- combining -----------------------------------------------------------------
    @classmethod
    def merge(cls, parts: Sequence[Manifest]) -> Manifest:
        """Join partial manifests (of ``build --part i/N``) into one, ordered by part."""
        if not parts:
            raise ConfigError("nothing to merge")
        algos = {p.checksum_algorithm for p in parts}
        if len(algos) > 1:
            raise ManifestError(f"cannot merge manifests with checksum algorithms {sorted(algos)}")
        ordered = sorted(parts, key=lambda p: (p.part or {}).get("index") or 0)
        counts = {p.part["count"] for p in parts if p.part is not None}
        indexes = [(p.part or {}).get("index") for p in ordered if p.part is not None]
        if len(indexes) != len(set(indexes)):
            raise ManifestError(f"part indexes repeat: {indexes}")
        if len(counts) > 1:
            raise ManifestError(f"parts come from different partitions: counts {sorted(counts)}")
        shards: list[ShardEntry] = []
        seen: set[str] = set()
        fields: dict[str, dict[str, int]] = {}
        for p in ordered:
            for s in p.shards:
                url = p.rebase(s.url, ordered[0].base)
                if normalize_url(url) in seen:
                    raise ManifestError(f"shard {url} is in more than one part")
                seen.add(normalize_url(url))
                index = p.rebase(s.index, ordered[0].base) if s.index else None
                same = url == s.url and index == s.index
                shards.append(s if same else replace(s, url=url, index=index))
            for name, st in p.fields.items():
                acc = fields.setdefault(name, {"count": 0, "bytes": 0})
                acc["count"] += st.get("count", 0)
                acc["bytes"] += st.get("bytes", 0)
        created = dict(ordered[0].created)
        if counts and len(indexes) != next(iter(counts)):
            created["incomplete"] = f"{len(indexes)} of {next(iter(counts))} parts"
        return cls(
            shards=shards,
            checksum_algorithm=algos.pop(),
            fields=fields,
            created=created,
            base=ordered[0].base,
            origins=tuple(dict.fromkeys(o for p in ordered for o in p.origins)),
        )

    def rebase(self, url: str, new_base: str | None) -> str:
        """Express ``url`` (relative to this manifest) relative to ``new_base`` if it can."""
        if self.base is None or new_base is None or self.base == new_base or is_absolute(url):
            return url
        full = join(self.base, url)
        prefix = new_base.rstrip("/") + "/"
        return full[len(prefix) :] if full.startswith(prefix) else full

    # -- urls ----------------------------------------------------------------------
    def resolve(self, url: str, *, allow_unsafe_urls: bool = False) -> str:
        """The absolute url or path of a shard url (see :func:`resolve_url`)."""
        return resolve_url(
            self.base, url, allow_unsafe_urls=allow_unsafe_urls, origins=self.origins
        )


def incomplete_reason(m: Manifest) -> str | None:
    """Why ``m`` does not describe its whole data set, or None when it does.

    A build that stopped (a bad record, a crash, a kill) leaves ``created.build.complete``
    false, and a merge of only some parts ``created.incomplete``.
    """
    held = f"it lists {m.total_samples:,} samples in {len(m)} shards"
    build = m.created.get("build")
    if isinstance(build, dict) and build.get("complete") is False:
        stopped = build.get("stopped")
        why = f"it stopped at: {stopped}" if stopped else "it was killed or is still running"
        return (
            f"incomplete: the build that wrote it did not finish ({why}); {held}; finish it "
            "with `shardkit build ... --resume` or build again with --overwrite"
        )
    parts = m.created.get("incomplete")
    if parts:
        return f"incomplete: merged from only {parts}; {held}"
    return None


def creation_info(**extra: Any) -> dict[str, Any]:
    """The ``created`` block: tool, version and UTC time."""

    info: dict[str, Any] = {
        "tool": "shardkit",
        "version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info.update(extra)
    return info


def add_fields(acc: FieldStats, more: FieldStats) -> None:
    """Add one manifest's (or shard's) field stats ``more`` into ``acc``."""
    for name, st in more.items():
        a = acc.setdefault(name, {"count": 0, "bytes": 0})
        a["count"] += st["count"]
        a["bytes"] += st["bytes"]
