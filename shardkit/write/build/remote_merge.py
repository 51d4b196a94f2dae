"""Joining partial manifests that live in an object store into one manifest there.

The parts are what writers left under one prefix (``ShardWriter("s3://b/set/part-0007/",
part=(7, 64))`` per task, or ``shardkit build --part``'s manifests copied up): each is read
with its ETag record, a part still holding unfolded journal entries (a writer that did not
close) is refused, and the merged manifest lists every shard relative to its own place
(shards must lie under it), with the parts' ETags carried over so a later resume can check
them. As for local parts, a missing part is an error unless ``allow_incomplete``.
"""

from __future__ import annotations

import dataclasses
import itertools
import posixpath

from shardkit.errors import ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.urls import join
from shardkit.write.build.targets import build_info
from shardkit.write.writer.outputs import ObjectOutput

__all__ = ["merge_object_parts"]


def _output(url: str) -> ObjectOutput:
    head, name = posixpath.split(url)
    return ObjectOutput(head + "/", name)


def merge_object_parts(
    parts: list[str], out_url: str, *, allow_incomplete: bool = False
) -> Manifest:
    """Merge the part manifests at ``parts`` (object-store urls) into ``out_url``."""
    loaded: list[Manifest] = []
    tags: dict[str, str] = {}
    for url in parts:
        out = _output(url)
        m, journal = out.existing()
        if m is None:
            raise ManifestError("no manifest there", path=url)
        info = build_info(m)
        if journal or (info and not info.get("complete")):
            raise ManifestError(
                "this part's writer did not finish: run it again with resume", path=url
            )
        loaded.append(m)
        tags.update({f"{m.base}/{name}": tag for name, tag in out.tags.items()})
    merged = Manifest.merge(loaded)
    incomplete = merged.created.get("incomplete")
    if incomplete and not allow_incomplete:
        count = next(p.part["count"] for p in loaded if p.part is not None)
        have = {p.part["index"] for p in loaded if p.part is not None}
        gaps = (i for i in range(count) if i not in have)
        missing = ", ".join(str(i) for i in itertools.islice(gaps, 10))
        raise ManifestError(f"only {incomplete} given: part {missing} missing", path=out_url)
    final = _output(out_url)
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
    final.write_manifest(merged)
    return merged
