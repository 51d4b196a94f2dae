"""The writer's journal of finished shards: one fsynced JSON line per shard beside the
manifest (``.manifest.json.journal``), so a build's per-shard cost stays flat; folded into
manifest.json at close and on resume. A line cut short by a kill ends it."""

from __future__ import annotations

import json
import logging
import os

from shardkit.durable import open_regular
from shardkit.errors import ManifestError
from shardkit.format.manifest.check import check_entry
from shardkit.format.manifest.model import ShardEntry

__all__ = ["journal_path", "parse_journal", "read_journal"]

log = logging.getLogger(__name__)


def journal_path(manifest_path: str) -> str:
    """Where a writer journals the shards it finished since it last wrote the manifest."""
    head, tail = os.path.split(manifest_path)
    return os.path.join(head, f".{tail}.journal")


def read_journal(manifest_path: str) -> list[tuple[ShardEntry, dict[str, dict[str, int]]]]:
    """The whole entries of a journal, in order (a line cut short by a kill ends it)."""
    path = journal_path(manifest_path)
    try:  # a FIFO or a device is refused by name, never waited on or read forever
        fd = open_regular(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ManifestError(f"cannot read the build's journal: {exc.strerror}", path=path) from exc
    with open(fd, "rb") as f:
        return parse_journal(f.read(), path, manifest_path)


def parse_journal(
    data: bytes, path: str, manifest: str
) -> list[tuple[ShardEntry, dict[str, dict[str, int]]]]:
    """The whole entries of journal bytes read from ``path``, in order (a line cut short
    by a kill ends it); ``manifest`` names the manifest they belong to in messages."""
    out: list[tuple[ShardEntry, dict[str, dict[str, int]]]] = []
    lines = data.split(b"\n")
    for i, line in enumerate(lines[:-1]):  # the last piece has no newline: cut short
        try:
            raw = json.loads(line)
            entry = ShardEntry(**check_entry(raw["shard"], path, i))
            fields = {
                str(k): {"count": int(v["count"]), "bytes": int(v["bytes"])}
                for k, v in raw["fields"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError, ManifestError):
            log.warning("%s: line %d is damaged; the journal ends there", manifest, i + 1)
            break
        out.append((entry, fields))
    return out
