"""The checksum manifest: which shards a data set has, their sizes, sample counts, checksums.

JSON (versioned; the schema is ``manifests/manifest.schema.json``) with a CSV export of
``url,size,nsamples,checksum``. Shard urls are relative to the manifest's location unless
absolute; :meth:`Manifest.resolve` refuses ``pipe:`` urls and urls outside the manifest's
base unless the caller allows them in code.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import posixpath
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from shardkit.checksum import split_checksum
from shardkit.errors import ConfigError, ManifestError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Manifest",
    "ShardEntry",
    "atomic_write",
    "expand_braces",
    "resolve_url",
]

FORMAT_NAME = "shardkit.manifest"
FORMAT_VERSION = 1
CSV_HEADER = ("url", "size", "nsamples", "checksum")
_REMOTE = ("http://", "https://", "s3://", "gs://")


@dataclass(frozen=True)
class ShardEntry:
    """One shard: ``url`` (relative to the manifest unless absolute), its ``size`` in bytes,
    ``nsamples``, ``checksum`` as ``algo:hex`` and optionally the url of its sample index.
    """

    url: str
    size: int
    nsamples: int
    checksum: str
    index: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "url": self.url,
            "size": self.size,
            "nsamples": self.nsamples,
            "checksum": self.checksum,
        }
        if self.index is not None:
            d["index"] = self.index
        return d


def _check_entry(raw: Any, path: str | None, i: int) -> ShardEntry:
    if not isinstance(raw, dict):
        raise ManifestError("shard entry must be an object", path=path, entry=i)
    for name in ("url", "checksum"):
        v = raw.get(name)
        if not isinstance(v, str) or not v:
            raise ManifestError(
                f"missing or not a non-empty string: {v!r}", path=path, entry=i, field=name
            )
    for name in ("size", "nsamples"):
        v = raw.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ManifestError(
                f"must be a non-negative integer, got {v!r}", path=path, entry=i, field=name
            )
    try:
        split_checksum(raw["checksum"])
    except ConfigError as exc:
        raise ManifestError(str(exc), path=path, entry=i, field="checksum") from None
    index = raw.get("index")
    if index is not None and (not isinstance(index, str) or not index):
        raise ManifestError(f"must be a string, got {index!r}", path=path, entry=i, field="index")
    unknown = set(raw) - {"url", "size", "nsamples", "checksum", "index"}
    if unknown:
        raise ManifestError(f"unknown keys {sorted(unknown)}", path=path, entry=i)
    return ShardEntry(raw["url"], raw["size"], raw["nsamples"], raw["checksum"], index)


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
    """

    shards: list[ShardEntry] = field(default_factory=list)
    checksum_algorithm: str = "sha256"
    fields: dict[str, dict[str, int]] = field(default_factory=dict)
    created: dict[str, Any] = field(default_factory=dict)
    part: dict[str, int] | None = None
    base: str | None = None

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
        base = _dirname(source) if source else None
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ManifestError(f"not UTF-8 at byte {exc.start}", path=source) from None
        if source is not None and source.lower().endswith(".csv"):
            return cls._from_csv(text, source, base)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(
                f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                path=source,
            ) from None
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: Any, *, source: str | None = None) -> Manifest:
        """Build a manifest from parsed JSON, checking every field."""
        if not isinstance(raw, dict):
            raise ManifestError("top level must be an object", path=source)
        if raw.get("format") != FORMAT_NAME:
            raise ManifestError(
                f"not a shardkit manifest (format={raw.get('format')!r})",
                path=source,
                field="format",
            )
        version = raw.get("version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"manifest version {version!r} is not supported (this shardkit reads "
                f"version {FORMAT_VERSION}); upgrade shardkit",
                path=source,
                field="version",
            )
        algo = raw.get("checksum_algorithm", "sha256")
        shards_raw = raw.get("shards")
        if not isinstance(shards_raw, list):
            raise ManifestError("must be a list", path=source, field="shards")
        shards = [_check_entry(e, source, i) for i, e in enumerate(shards_raw)]
        for i, s in enumerate(shards):
            if not s.checksum.startswith(algo + ":"):
                raise ManifestError(
                    f"checksum {s.checksum[:20]}... is not {algo}",
                    path=source,
                    entry=i,
                    field="checksum",
                )
        for name in ("total_samples", "total_bytes"):
            if name in raw:
                want = sum(
                    getattr(s, "nsamples" if name == "total_samples" else "size") for s in shards
                )
                if raw[name] != want:
                    raise ManifestError(
                        f"says {raw[name]!r} but the shards add up to {want}",
                        path=source,
                        field=name,
                    )
        fields_raw = raw.get("fields", {})
        if not isinstance(fields_raw, dict):
            raise ManifestError("must be an object", path=source, field="fields")
        part = raw.get("part")
        if part is not None and not (
            isinstance(part, dict)
            and isinstance(part.get("index"), int)
            and isinstance(part.get("count"), int)
        ):
            raise ManifestError("must be {'index': i, 'count': n}", path=source, field="part")
        return cls(
            shards=shards,
            checksum_algorithm=algo,
            fields=dict(fields_raw),
            created=dict(raw.get("created", {})),
            part=part,
            base=_dirname(source) if source else None,
        )

    @classmethod
    def _from_csv(cls, text: str, source: str | None, base: str | None) -> Manifest:
        rows = csv.reader(io.StringIO(text))
        header = next(rows, None)
        if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
            raise ManifestError(f"CSV header must be {','.join(CSV_HEADER)}", path=source, entry=1)
        shards = []
        for lineno, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != 4:
                raise ManifestError(
                    f"line {lineno}: expected 4 columns, got {len(row)}", path=source, entry=lineno
                )
            try:
                raw = {
                    "url": row[0],
                    "size": int(row[1]),
                    "nsamples": int(row[2]),
                    "checksum": row[3],
                }
            except ValueError:
                raise ManifestError(
                    f"line {lineno}: size and nsamples must be integers", path=source, entry=lineno
                ) from None
            shards.append(_check_entry(raw, source, lineno))
        algos = {split_checksum(s.checksum)[0] for s in shards} or {"sha256"}
        if len(algos) > 1:
            raise ManifestError(f"mixes checksum algorithms {sorted(algos)}", path=source)
        return cls(shards=shards, checksum_algorithm=algos.pop(), base=base)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read a local manifest (``.json`` or ``.csv``)."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
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
        d["shards"] = [s.to_dict() for s in self.shards]
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

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
                if url in seen:
                    raise ManifestError(f"shard {url} is in more than one part")
                seen.add(url)
                index = p.rebase(s.index, ordered[0].base) if s.index else None
                shards.append(replace(s, url=url, index=index))
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
        )

    def rebase(self, url: str, new_base: str | None) -> str:
        """Express ``url`` (relative to this manifest) relative to ``new_base`` if it can."""
        if self.base is None or new_base is None or self.base == new_base or _is_abs(url):
            return url
        full = _join(self.base, url)
        prefix = new_base.rstrip("/") + "/"
        return full[len(prefix) :] if full.startswith(prefix) else full

    # -- urls ----------------------------------------------------------------------
    def resolve(self, url: str, *, allow_unsafe_urls: bool = False) -> str:
        """The absolute url or path of a shard url (see :func:`resolve_url`)."""
        return resolve_url(self.base, url, allow_unsafe_urls=allow_unsafe_urls)


def _is_abs(url: str) -> bool:
    return "://" in url or url.startswith(("/", "pipe:"))


def _dirname(source: str) -> str:
    if "://" in source:
        parts = urlsplit(source)
        return parts._replace(path=posixpath.dirname(parts.path), query="", fragment="").geturl()
    return os.path.dirname(os.path.abspath(source))


def _join(base: str, url: str) -> str:
    if "://" in base:
        parts = urlsplit(base)
        path = posixpath.normpath(posixpath.join(parts.path or "/", url))
        return parts._replace(path=path).geturl()
    return os.path.normpath(os.path.join(base, url))


def resolve_url(base: str | None, url: str, *, allow_unsafe_urls: bool = False) -> str:
    """Resolve a manifest's shard ``url`` against ``base`` (the manifest's directory).

    Refused unless ``allow_unsafe_urls``: ``pipe:`` urls (a manifest must never make
    shardkit run a command) and any url that resolves outside ``base`` (``../..``,
    ``file:///etc/...``, another host). Raises :class:`ManifestError`.
    """
    if url.startswith("pipe:"):
        if not allow_unsafe_urls:
            raise ManifestError(
                f"refusing url {url!r}: a manifest may not run commands "
                "(pass allow_unsafe_urls=True in code to allow it)",
                field="url",
            )
        return url
    if base is None:
        return url
    target = url
    if url.startswith("file://"):
        target = unquote(urlsplit(url).path)
    full = target if _is_abs(target) else _join(base, target)
    if "://" not in base and "://" not in full:
        full = os.path.normpath(full)
    prefix = base.rstrip("/") + "/"
    if not allow_unsafe_urls and not full.startswith(prefix):
        raise ManifestError(
            f"refusing url {url!r}: it resolves to {full!r}, outside the "
            f"manifest's base {base!r} (pass allow_unsafe_urls=True to allow "
            "it)",
            field="url",
        )
    return full


_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``data-{000000..000099}.tar`` into the list of names (zero padding kept)."""
    m = _BRACE.search(pattern)
    if m is None:
        if "{" in pattern or "}" in pattern:
            raise ConfigError(f"bad brace pattern {pattern!r}: use {{000000..000099}}")
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    if int(hi) < int(lo):
        raise ConfigError(f"bad brace pattern {pattern!r}: {hi} < {lo}")
    width = len(lo) if lo.startswith("0") else 0
    head, tail = pattern[: m.start()], pattern[m.end() :]
    out: list[str] = []
    for i in range(int(lo), int(hi) + 1):
        out.extend(head + str(i).zfill(width) + rest for rest in expand_braces(tail))
    return out


def atomic_write(path: str, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` to ``path`` durably: temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray)):
                f.write(data)
            else:
                for chunk in data:
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def creation_info(**extra: Any) -> dict[str, Any]:
    """The ``created`` block: tool, version and UTC time."""
    from shardkit import __version__

    info: dict[str, Any] = {
        "tool": "shardkit",
        "version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info.update(extra)
    return info
