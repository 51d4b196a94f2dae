"""Sample indexes as older shardkit versions wrote them, put in place of a set's own."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from shardkit.format.tario.index import parse_index, write_index


def older_index(data: bytes, version: int, shard_checksum: str) -> bytes:
    """A version 3 index ``data`` as version ``version`` (1 or 2) wrote it: the digests
    (and for 1 the binding and signatures) left out, the offsets as they are."""
    idx = parse_index(data)
    offsets = idx.offsets[:-1].tolist()
    end = int(idx.offsets[-1])
    if version == 1:
        return write_index(offsets, end)
    assert version == 2 and idx.signatures is not None
    return write_index(
        offsets, end, signatures=idx.signatures.tolist(), shard_checksum=shard_checksum
    )


def put_index(manifest: Path, i: int, index: bytes, *, with_checksum: bool = True) -> None:
    """``index`` in place of shard ``i``'s, the manifest vouching for it by its
    ``index_checksum`` (``with_checksum``) or giving none (read by ranged reads)."""
    doc: dict[str, Any] = json.loads(manifest.read_text())
    entry = doc["shards"][i]
    (manifest.parent / entry["index"]).write_bytes(index)
    if with_checksum:
        entry["index_checksum"] = "sha256:" + hashlib.sha256(index).hexdigest()
    else:
        entry.pop("index_checksum", None)
    manifest.write_text(json.dumps(doc))


def as_version(manifest: Path, version: int) -> None:
    """Every index of the set at ``manifest`` rewritten as version ``version`` wrote it
    (3: left as it is), the manifest vouching for each."""
    if version == 3:
        return
    doc = json.loads(manifest.read_text())
    for i, entry in enumerate(doc["shards"]):
        data = (manifest.parent / entry["index"]).read_bytes()
        put_index(manifest, i, older_index(data, version, entry["checksum"]))
