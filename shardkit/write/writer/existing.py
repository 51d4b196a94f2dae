"""What a :class:`~shardkit.write.writer.ShardWriter` finds in a local output directory: a
data set to refuse, or to replace (``overwrite``)."""

from __future__ import annotations

import contextlib
import os
import re

from shardkit.errors import ConfigError, ManifestError
from shardkit.format.layout import INDEX_DIR
from shardkit.format.manifest.compact import compact_path
from shardkit.format.manifest.journal import journal_path
from shardkit.format.manifest.model import Manifest

__all__ = ["refuse_existing", "remove_existing"]


def _shard_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-\d{{6,}}\.tar(?:\.zst|\.gz)?(?:\.idx)?$")


def refuse_existing(manifest_path: str) -> None:
    """A data set already at ``manifest_path`` is not replaced by accident (it was: 300
    samples became 1, the old shard left as a stray file): a ConfigError naming the ways out."""
    if not os.path.exists(manifest_path):
        return
    try:
        old = Manifest.load(manifest_path)
        what = f"{len(old)} shards, {old.total_samples} samples"
    except ManifestError as exc:
        what = f"unreadable: {exc}"
    raise ConfigError(
        f"{os.path.dirname(manifest_path) or '.'} already holds a data set ({manifest_path}: "
        f"{what}): pass overwrite=True to replace it, resume=True to add to it, or use "
        "another directory"
    )


def remove_existing(manifest_path: str, prefix: str) -> None:
    """``overwrite``: delete the manifest (and its csv, compact form, journal), the shards
    and indexes it lists in its own directory, and the shards of ``prefix`` there."""
    out_dir = os.path.dirname(manifest_path) or "."
    real_dir = os.path.realpath(out_dir)
    doomed: set[str] = set()
    with contextlib.suppress(FileNotFoundError, ManifestError):
        old = Manifest.load(manifest_path)
        for s in old.shards:
            for url in (s.url, s.index):
                path = os.path.realpath(os.path.join(out_dir, url or ""))
                if url and os.path.dirname(path) in (real_dir, os.path.join(real_dir, INDEX_DIR)):
                    doomed.add(path)
    mine = _shard_pattern(prefix)
    for folder in (out_dir, os.path.join(out_dir, INDEX_DIR)):
        if os.path.isdir(folder):
            doomed.update(os.path.join(folder, n) for n in os.listdir(folder) if mine.match(n))
    stem = os.path.splitext(manifest_path)[0]
    doomed.update((manifest_path, stem + ".csv", compact_path(manifest_path)))
    doomed.add(journal_path(manifest_path))
    for path in sorted(doomed):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
