"""Looking after a cache dir as a whole (``shardkit cache stat|clean|verify``): a scan of
``data/`` each, which also checks the ledger against the disk (and rebuilds it if they
disagree).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from shardkit.cache.layout import CachedShard, CacheStat
from shardkit.cache.locks import try_lock_existing
from shardkit.cache.store import CacheStore
from shardkit.io.verified import file_digest

__all__ = ["clean", "reconcile", "scrub", "stat"]

log = logging.getLogger(__name__)


def scrub(
    store: CacheStore, progress: Callable[[int], object] | None = None
) -> list[tuple[str, str]]:
    """Hash every cached shard again (disk rot): a shard whose bytes no longer match the
    checksum its place names is evicted (one being read: evicted by the next eviction
    that finds it free, and reported). Returns ``(path, what is wrong)`` per bad shard.
    """
    bad: list[tuple[str, str]] = []
    for shard in list(store.shards()):
        algo = os.path.basename(os.path.dirname(os.path.dirname(shard.path)))
        want = os.path.basename(shard.path)
        try:
            with open(shard.path, "rb") as f:
                got = file_digest(f.fileno(), shard.size, algo)
        except FileNotFoundError:
            continue  # evicted meanwhile
        if progress is not None:
            progress(shard.size)
        if got == want:
            continue
        with store._lock(store.evict_lock_path()):
            fd = try_lock_existing(shard.path)
            if fd is None:
                bad.append((shard.path, f"{algo} differs; being read, not evicted yet"))
                continue
            store._unlink([(fd, shard)])
        log.warning("cache: %s does not match its checksum: evicted", shard.path)
        bad.append((shard.path, f"{algo} differs; evicted"))
    return bad


def stat(store: CacheStore) -> CacheStat:
    """What the cache holds: shards, bytes, shards being read, downloads, dead files."""
    shards = list(store.shards())
    in_use = 0
    if shards:
        store.ensure()  # its locks dir
        with store._lock(store.evict_lock_path()):  # as leases are taken
            reconcile(store, shards)
            for s in shards:
                fd = try_lock_existing(s.path)
                if fd is None:
                    in_use += 1
                else:
                    os.close(fd)
    parts = list(store.parts())
    live = [p for p in parts if store._live(p)]
    return CacheStat(
        root=store.root,
        shards=len(shards),
        bytes=sum(s.size for s in shards),
        in_use=in_use,
        downloading=len(live),
        downloading_bytes=sum(p.size for p in live),
        dead_temp_files=len(parts) - len(live),  # resumable, or given up
        oldest_use=min((s.mtime for s in shards), default=None),
    )


def clean(store: CacheStore, keep: int = 0) -> tuple[int, int]:
    """Evict unleased shards until at most ``keep`` bytes stay, and remove dead temp
    files; returns ``(shards evicted, bytes freed)``.
    """
    store.ensure()
    with store._lock(store.evict_lock_path()):
        store._sweep()
        on_disk = list(store.shards())
        reconcile(store, on_disk)
        shards = sorted([*on_disk, *store._dead_parts()], key=lambda s: s.mtime)
        total = sum(s.size for s in shards)
        taken: list[tuple[int, CachedShard]] = []
        freed = 0
        for s in shards:
            if total - freed <= keep:
                break
            fd = try_lock_existing(s.path)
            if fd is not None:  # None: someone is reading it
                taken.append((fd, s))
                freed += s.size
        store._unlink(taken)
        return len(taken), freed


def reconcile(store: CacheStore, on_disk: list[CachedShard]) -> None:
    """Rescan if the ledger disagrees with a scan of ``data/`` (under the lock)."""
    ledger = store.ledger()
    listed = {os.path.join(store.root, rel): size for rel, (size, _) in ledger.entries.items()}
    if listed != {s.path: s.size for s in on_disk}:
        ledger.rescan("the ledger disagrees with a scan of data/")
