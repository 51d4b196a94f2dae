"""What a local manifest's compact form was built from, and whether it still fits.

A form names the SHA-256 of the manifest bytes it was built from and the stat of the file
they were hashed under: (device, inode, size, mtime_ns, ctime_ns). ctime moves with every
write and with every change of mtime, and no tool sets it back, so a file with that stat
was not written since and is not read again; any other stat (a manifest rewritten in place
with the same size and mtime set back, a copy) means the content is hashed and compared.
A process remembers the hash per stat, so it reads a changed manifest once.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from shardkit.durable import open_regular
from shardkit.errors import ManifestError

__all__ = ["fits_manifest", "manifest_sha256", "read_source", "source_facts", "stat_key"]

_HASHED: dict[tuple[int, ...], str] = {}  # a manifest's SHA-256 per stat, in this process


def stat_key(st: os.stat_result) -> list[int]:
    """What says a file was not written since: ctime moves with every write and with
    every change of mtime, and no tool sets it back."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def manifest_sha256(path: str) -> tuple[str, list[int]]:
    """The SHA-256 of the file at ``path`` and the stat it was taken under (remembered per
    stat: the file is read again only once it changed)."""
    key = stat_key(os.stat(path))
    known = _HASHED.get(tuple(key))
    if known is not None:
        return known, key
    h = hashlib.sha256()
    with open(open_regular(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        after = stat_key(os.fstat(f.fileno()))
    if after == key:  # not written while it was read
        _HASHED[tuple(key)] = h.hexdigest()
    return h.hexdigest(), key


def read_source(path: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of the manifest at ``path`` and their :func:`source_facts` (no stat
    where the file was written while it was read: its content is checked next time)."""
    try:  # a FIFO or a device is refused by name, never waited on or read forever
        fd = open_regular(path)
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror}", path=path) from exc
    with open(fd, "rb") as f:
        before = stat_key(os.fstat(f.fileno()))
        data = f.read()
        after = stat_key(os.fstat(f.fileno()))
    return data, source_facts(data, before if before == after else None)


def source_facts(data: bytes, key: list[int] | None) -> dict[str, Any]:
    """What a form built from ``data`` names as its source: their size and SHA-256, and
    the stat ``key`` of the file they were read from under it (see :func:`stat_key`)."""
    sha = hashlib.sha256(data).hexdigest()
    if key is not None:
        _HASHED[tuple(key)] = sha
    return {"size": len(data), "stat": key, "sha256": sha}


def fits_manifest(header: dict[str, Any], manifest_path: str) -> bool:
    """Whether the form was built from the manifest now at ``manifest_path``: by its
    content, unless its stat is the one the form's hash was taken under."""
    src = header.get("source") or {}
    st = os.stat(manifest_path)
    if src.get("stat") is not None and src.get("stat") == stat_key(st):
        return True
    if src.get("size") != st.st_size:
        return False
    return manifest_sha256(manifest_path)[0] == src.get("sha256")
