"""``manifest merge``: the partial manifests of ``build --part`` (or of
``ShardWriter(..., part=(i, n))`` tasks) joined into one manifest.

A part whose writer did not finish is refused, and a set of parts with one missing (unless
``allow_incomplete``). The merged manifest lists every shard relative to its own place, so
the shards must lie under it. Local parts' skipped-record reports are joined beside it; parts
in an object store carry their ETags over, so a later resume can check them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import posixpath
from collections.abc import Sequence

from shardkit.errors import ConfigError, ManifestError, redact
from shardkit.format.manifest.model import Manifest, creation_info
from shardkit.urls import is_absolute, join
from shardkit.write.writer.local import LocalTarget
from shardkit.write.writer.objects import ObjectTarget
from shardkit.write.writer.target import Target, build_info, errors_name

__all__ = ["keep_other_set", "merge_object_parts", "merge_parts"]


def _check_finished(m: Manifest, path: str, *, journal: bool = False) -> None:
    info = build_info(m)
    if journal or (info and not info.get("complete")):
        how = (
            "writer did not finish: run it again with resume"
            if journal
            else ("build did not finish: run it again with --resume")
        )
        raise ManifestError(f"this part's {how}", path=path)


def _check_whole(merged: Manifest, parts: Sequence[Manifest], where: str, allow: bool) -> None:
    """A set of parts with one missing is an error naming the first missing ones."""
    incomplete = merged.created.get("incomplete")
    if not incomplete or allow:
        return
    count = next(p.part["count"] for p in parts if p.part is not None)
    have = {p.part["index"] for p in parts if p.part is not None}
    gaps = (i for i in range(count) if i not in have)  # lazily: count may be 10**9
    missing = ", ".join(str(i) for i in itertools.islice(gaps, 10))
    more = ", ..." if count - len(have) > 10 else ""
    raise ManifestError(f"only {incomplete} given: part {missing}{more} missing", path=where)


def merge_parts(
    paths: Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    *,
    allow_incomplete: bool = False,
    overwrite: bool = False,
) -> Manifest:
    """Join the local partial manifests ``paths`` into one manifest at ``out_path``; urls
    are rewritten relative to ``out_path``'s folder, which must hold every shard. A
    manifest there that lists other shards is replaced only with ``overwrite``."""
    parts = [Manifest.load(p) for p in paths]
    for path, m in zip(paths, parts, strict=True):
        _check_finished(m, str(path))
    merged = Manifest.merge(parts)
    out = os.path.abspath(os.fspath(out_path))
    _check_whole(merged, parts, out, allow_incomplete)
    incomplete = merged.created.get("incomplete")
    base = os.path.dirname(out)
    shards = []
    for s in merged.shards:
        url = _under(merged.rebase(s.url, base), base)
        index = _under(merged.rebase(s.index, base), base) if s.index else None
        if os.path.isabs(url) or url.startswith("../"):
            raise ManifestError(
                f"shard {url} is outside {base}; write the merged manifest higher up"
            )
        same = url == s.url and index == s.index
        shards.append(s if same else dataclasses.replace(s, url=url, index=index))
    merged.shards, merged.base = shards, base
    merged.created = creation_info(merged_parts=len(parts))
    if incomplete:
        merged.created["incomplete"] = incomplete
    final = LocalTarget(base, os.path.basename(out))
    skipped = _join_reports(paths, parts, final)
    if skipped:
        report = errors_name(final.manifest_name)
        merged.created["build"] = {"complete": True, "skipped_records": skipped, "errors": report}
    keep_other_set(final, merged, overwrite)
    final.write_manifest(merged)
    return merged


def _where(m: Manifest, base: str) -> set[str]:
    """Where the shards of ``m`` lie (absolute paths or urls; ``base`` if it names none)."""
    b = m.base or base
    return {s.url if is_absolute(s.url) else join(b, s.url) for s in m.shards}


def keep_other_set(target: Target, new: Manifest, overwrite: bool) -> None:
    """A manifest at ``target`` that lists a shard ``new`` does not (another data set) is
    replaced only with ``overwrite`` (``manifest merge``/``from-shards`` replaced one with
    exit 0): a ConfigError naming it and the ways out."""
    if overwrite:
        return
    try:
        old = target.read_manifest()
        what = "" if old is None else f"{len(_where(old, target.base) - _where(new, target.base))}"
        what += f" of its {len(old)} shards" if old is not None else ""
    except ManifestError as exc:
        what = f"it is unreadable ({exc}) and"
    if not what or what.startswith("0 of"):
        return
    raise ConfigError(
        f"{redact(target.manifest_path)} already holds a manifest: {what} would no longer be "
        "listed: pass --overwrite (overwrite=True) to replace it, or write to another -o"
    )


def _under(url: str, base: str) -> str:
    """A shard path relative to ``base`` where it lies under it: the merge of parts in
    sibling folders (``part-0007/``) gives the later parts' shards as absolute paths."""
    if os.path.isabs(url):
        rel = os.path.relpath(url, base)
        if rel != ".." and not rel.startswith("../"):
            return rel.replace(os.sep, "/")
    return url


def _join_reports(
    paths: Sequence[str | os.PathLike[str]], parts: Sequence[Manifest], final: LocalTarget
) -> int:
    """The parts' skipped-record reports joined, in part order, beside the merged manifest;
    the number of records they name (what the parts' manifests count)."""
    found: list[tuple[int, LocalTarget]] = []
    skipped = 0
    for path, m in zip(paths, parts, strict=True):
        info = build_info(m)
        count = int(info.get("skipped_records") or 0)
        if not count:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        report = os.path.join(folder, str(info.get("errors")))
        if not os.path.exists(report):
            raise ManifestError(
                f"this part skipped {count} records but its report {report} is missing",
                path=str(path),
            )
        skipped += count
        # the report a part names is its manifest's: errors_name(its manifest name)
        found.append(((m.part or {}).get("index", 0), LocalTarget(folder, os.path.basename(path))))
    final.join_reports([t for _, t in sorted(found, key=lambda f: f[0])])
    return skipped


def _object_target(url: str) -> ObjectTarget:
    head, name = posixpath.split(url)
    return ObjectTarget(head + "/", name)


def merge_object_parts(
    parts: list[str], out_url: str, *, allow_incomplete: bool = False, overwrite: bool = False
) -> Manifest:
    """Merge the part manifests at ``parts`` (object-store urls) into ``out_url`` (a
    manifest there that lists other shards is replaced only with ``overwrite``)."""
    loaded: list[Manifest] = []
    tags: dict[str, str] = {}
    for url in parts:
        out = _object_target(url)
        m, journal = out.existing()
        if m is None:
            raise ManifestError("no manifest there", path=url)
        _check_finished(m, url, journal=bool(journal))
        loaded.append(m)
        tags.update({f"{m.base}/{name}": tag for name, tag in out.tags.items()})
    merged = Manifest.merge(loaded)
    _check_whole(merged, loaded, out_url, allow_incomplete)
    final = _object_target(out_url)
    shards = []
    prefix = final.base.rstrip("/") + "/"

    def under(url: str) -> str:
        full = url if "://" in url else join(str(merged.base), url)
        if not full.startswith(prefix):
            raise ManifestError(
                f"shard {full} is outside {final.base}; write the merged manifest higher up"
            )
        return full[len(prefix) :]

    for s in merged.shards:
        url = under(s.url)
        index = under(s.index) if s.index else None
        shards.append(dataclasses.replace(s, url=url, index=index))
        tag = tags.get(prefix + url)
        if tag is not None:
            final.tags[url] = tag
    merged.shards, merged.base = shards, final.base
    keep_other_set(final, merged, overwrite)
    final.write_manifest(merged)
    return merged
