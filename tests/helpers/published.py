"""Waiting for a cache fill to publish what a reader already got."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from shardkit.cache import CacheKey, CacheStore
from shardkit.format.manifest.model import ShardEntry


def wait_published(cache: str | Path, entries: Sequence[ShardEntry], timeout: float = 30) -> None:
    """Wait until these shards are published: a reader gets a shard's last piece as soon
    as the piece is verified, and the publish (the whole checksum, the rename) follows."""
    store = CacheStore(str(cache))
    paths = [store.path(CacheKey.of(e.checksum, e.size)) for e in entries]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not published: {[p for p in paths if not os.path.exists(p)]}")
        time.sleep(0.01)
