"""The one place a writer's output is told apart: a local folder or an object-store prefix
(see :mod:`shardkit.write.writer.target`)."""

from __future__ import annotations

import os
import re

from shardkit.errors import ConfigError, redact
from shardkit.io.store_base import is_object_url
from shardkit.urls import parse_url
from shardkit.write.writer.local import LocalTarget
from shardkit.write.writer.objects import ObjectTarget
from shardkit.write.writer.options import shard_suffix
from shardkit.write.writer.target import Target

__all__ = ["open_target"]


def open_target(
    out: str | os.PathLike[str] | Target,
    manifest: str = "manifest.json",
    *,
    endpoint_url: str | None = None,
) -> Target:
    """The target of an output: an object-store url or a local folder; any other
    ``scheme://`` is an error, never a folder named after it. A Target is taken as it is."""
    if isinstance(out, Target):
        return out
    text = os.fspath(out)
    if manifest in ("", ".", "..") or "/" in manifest or os.sep in manifest:
        # its lock, journal and shards would lie in another folder than the manifest, where
        # a writer of that folder takes other locks: both were let in, one manifest
        raise ConfigError(
            f"manifest {manifest!r} is a file name in the output, not a path: name the folder "
            f"in the output ({redact(text)!r}) and the manifest alone "
            f"(manifest={os.path.basename(manifest) or 'manifest.json'!r})"
        )
    if manifest.endswith(tuple(shard_suffix(c) for c in (None, "zstd", "gzip"))):
        # a lock covers a manifest's name and a shard prefix, not each shard's name: a
        # writer of another prefix here was let in and its manifest replaced that shard
        raise ConfigError(
            f"manifest {manifest!r} is named as a shard is: name it *.json (manifest.json)"
        )
    if is_object_url(text):
        parse_url(text)  # the one url parser: #, ?, .., //, credentials refused before any I/O
        return ObjectTarget(str(text), manifest, endpoint_url)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise ConfigError(
            f"{redact(text)!r}: a writer writes to a local directory or to s3://, gs:// or az://; "
            "not to this scheme"
        )
    return LocalTarget(text, manifest)
