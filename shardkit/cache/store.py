"""The cache directory: content-addressed shards, temp files, leases, LRU eviction.

The directory's names are in :mod:`shardkit.cache.layout`.

A shard becomes visible in ``data/`` only by ``os.replace`` after its size and checksum
were verified, so a crash or SIGKILL never leaves a file that is later served as whole.
Every process that reads or fills a file holds a shared ``flock`` on it (a *lease*);
eviction takes an exclusive one without waiting and skips a file it cannot get. So a temp
file whose fill died is kept, counted and resumed by the next process that wants the
shard, and evicted like a shard (least recently used first) when room is needed. A fill
closes its file before it publishes it, so a shard in ``data/`` is held only by its
readers.

Everything that changes what the cache holds runs under the eviction lock, exclusively:
reservations, evictions, publishing and giving up temp files, so a reservation counts
shards and temp files at one instant (a shard being renamed from ``tmp/`` to ``data/`` is
never counted twice, nor missed). The shards are counted from the ledger, the few temp
files of fills in progress or dead from ``tmp/``: a reservation costs the same whatever
the number of shards cached.

The limit holds for the bytes on disk, not only for the names: a file is unlinked only
under an exclusive ``flock`` taken under the eviction lock, and leases are taken under that
lock too (shared), so no process can be between opening a file and leasing it when it is
unlinked, and no unlinked file keeps bytes that the cache no longer counts. A temp file
given up while a reader still holds it is renamed aside and stays counted until the last
reader lets go.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from shardkit.cache.folder import make_folder
from shardkit.cache.layout import (
    CachedShard,
    CacheKey,
    FillPieces,
    TempFile,
    inode_of,
    scan_data,
    scan_tmp,
)
from shardkit.cache.ledger import Entry, Ledger, Stale
from shardkit.cache.locks import locked, open_shared, try_lock_existing
from shardkit.durable import fsync_dir
from shardkit.errors import CacheError
from shardkit.per_process import PerProcess

__all__ = ["CacheStore"]

log = logging.getLogger(__name__)


class CacheStore:
    """One node-local cache directory (see the module docstring).

    Args:
        root: the cache directory (created on first use).
        limit: bytes the cache may hold, temp files included; None: no limit.
    """

    def __init__(
        self, root: str, limit: int | None = None, *, lock: Callable[..., Any] = locked
    ) -> None:
        self.root = os.path.abspath(root)
        self.limit = limit
        self._ready = False
        self._lock = lock  # the eviction lock's seam: tests watch who waits on it
        self._ledger: PerProcess[Ledger] = PerProcess(self._make_ledger)

    def __getstate__(self) -> dict[str, object]:
        # the eviction lock's seam is a test's hook: a copy in another process locks
        return {"root": self.root, "limit": self.limit, "_ready": False, "_ledger": self._ledger}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = locked

    # -- paths ---------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the directory layout (a clear :class:`CacheError` if it cannot)."""
        if self._ready:
            return
        make_folder(self.root)
        self._ready = True

    def path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "data", key.algo, key.digest[:2], key.digest)

    def part_path(self, key: CacheKey, layout: FillPieces | None = None) -> str:
        """The temp file of ``key`` filled by ``layout``: named by the checksum, the size
        and the piece table its map is verified against (:attr:`FillPieces.table`)."""
        lay = layout if layout is not None else FillPieces(key.size)
        name = f"{key.name}-{key.size}-p{lay.piece_size}-{lay.table}.part"
        return os.path.join(self.root, "tmp", name)

    def lock_path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "locks", f"{key.name}.lock")

    def evict_lock_path(self) -> str:
        return os.path.join(self.root, "locks", "evict.lock")

    # -- reading -------------------------------------------------------------------
    def lease(self, path: str) -> int | None:
        """Open ``path`` under a lease (a shared ``flock``); None if it is not there.

        Opened and locked under the eviction lock (shared), so no eviction falls between
        the two: a lease is never taken on a file that eviction has already unlinked.
        """
        self.ensure()
        with self._lock(self.evict_lock_path(), exclusive=False):
            return open_shared(path, os.O_RDONLY)  # never waits long: see the docstring

    def open_published(self, key: CacheKey) -> int | None:
        """Open a verified shard with a lease (shared lock), or None if it is not cached."""
        fd = self.lease(self.path(key))
        if fd is not None:
            with contextlib.suppress(OSError):
                os.utime(fd)  # least recently used goes first
        return fd

    def is_retired(self, fd: int, key: CacheKey, layout: FillPieces) -> bool:
        """Whether ``fd`` holds a temp file of ``key`` that was given up and renamed aside."""
        st = os.fstat(fd)
        here = (inode_of(self.part_path(key, layout)), inode_of(self.path(key)))
        return st.st_nlink > 0 and st.st_ino not in here

    # -- filling -----------------------------------------------------------------
    def open_part(self, key: CacheKey, layout: FillPieces) -> tuple[int | None, bool]:
        """``(fd, published)``: the verified shard if it is there (published True), else
        its temp file filled by ``layout``, open read-write: the one there (a fill running,
        or left by a dead one), or a new one if there is room; either under a lease. fd
        None: no room.

        Runs under the eviction lock: a new file is created only after temp files given up
        are removed and least recently used files nobody holds are evicted until it fits.
        """
        self.ensure()
        part = self.part_path(key, layout)
        nbytes = key.size + layout.count
        with self._lock(self.evict_lock_path()):
            ledger = self.ledger()
            fd = open_shared(self.path(key), os.O_RDONLY)
            if (fd is not None) != (self._rel(key) in ledger.entries):
                ledger.rescan("a shard opened is not in the ledger, or one in it is gone")
            if fd is not None:
                return fd, True
            fd = open_shared(part, os.O_RDWR)
            if fd is not None:
                if os.fstat(fd).st_size in (nbytes, key.size):  # whole, or cut: published
                    return fd, False
                os.close(fd)
                self._retire(part)  # not a file this layout made: start again
            if self.limit is not None and nbytes > self.limit:
                return None, False
            used = self._sweep() + ledger.total
            if self.limit is not None and used + nbytes > self.limit:
                used -= self._evict(used + nbytes - self.limit)
                if used + nbytes > self.limit:
                    return None, False
            fd = open_shared(part, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            assert fd is not None
            try:
                os.ftruncate(fd, nbytes)  # sparse: the map reads as "nothing verified"
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise
            return fd, False

    def publish(self, key: CacheKey, layout: FillPieces) -> bool:
        """Make a verified temp file (cut, synced and closed) visible as the cached shard;
        False if it was evicted meanwhile."""
        path, part = self.path(key), self.part_path(key, layout)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with self._lock(self.evict_lock_path()):  # not while bytes are counted
            ledger = self.ledger()
            try:
                st = os.stat(part)
            except FileNotFoundError:
                return False
            ledger.begin(add=[(self._rel(key), st.st_size, st.st_mtime_ns)])
            try:
                os.replace(part, path)
            except FileNotFoundError:
                ledger.end(False)
                return False
            ledger.end()
        fsync_dir(os.path.dirname(path))
        return True

    def discard(self, key: CacheKey, layout: FillPieces) -> None:
        """Give up the temp file of ``key``: removed, or renamed aside and still counted
        while readers hold it."""
        self.ensure()
        with self._lock(self.evict_lock_path()):
            self._retire(self.part_path(key, layout))

    def evict_rotten(self, key: CacheKey) -> None:
        """Take a cached shard whose bytes no longer match out of ``data/``: removed, or
        (another process reads it) renamed aside into ``tmp/``, counted until let go."""
        self.ensure()
        with self._lock(self.evict_lock_path()):
            path = self.path(key)
            fd = try_lock_existing(path)
            if fd is not None:
                self._unlink([(fd, CachedShard(path, key.size, 0.0))])
                return
            ino = inode_of(path)
            if ino is None:
                return  # evicted meanwhile
            ledger = self.ledger()
            ledger.begin(dels=[self._rel(key)])
            try:
                os.replace(path, f"{self.part_path(key)}.gone-{ino}")
            finally:
                ledger.end()

    def let_go(self, fd: int, key: CacheKey, layout: FillPieces | None) -> None:
        """Close a reader's ``fd``; a temp file given up while it was read is removed now."""
        try:
            retired = layout is not None and self.is_retired(fd, key, layout)
        except OSError:
            retired = False
        os.close(fd)
        if retired:
            with contextlib.suppress(OSError, CacheError):  # else the next reservation does it
                self.sweep()

    def sweep(self) -> None:
        """Remove the temp files that nobody downloads or reads any more."""
        self.ensure()
        with self._lock(self.evict_lock_path()):
            self._sweep()

    # -- accounting and eviction ---------------------------------------------------
    def ledger(self) -> Ledger:
        """The ledger of ``data/``, caught up (called under the exclusive eviction lock)."""
        ledger = self._ledger.get()
        ledger.sync()
        return ledger

    def _make_ledger(self) -> Ledger:
        return Ledger(self.root, self._scan)

    def _rel(self, key: CacheKey) -> str:
        return os.path.relpath(self.path(key), self.root)

    def _scan(self) -> Iterator[Entry]:
        for s in self.shards():
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(s.path)
                yield os.path.relpath(s.path, self.root), st.st_size, st.st_mtime_ns

    def _stat(self, rel: str) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self.root, rel))
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    def shards(self) -> Iterator[CachedShard]:
        """Every verified shard in the cache (a scan of ``data/``)."""
        return scan_data(os.path.join(self.root, "data"))

    def parts(self) -> Iterator[TempFile]:
        """Every temp file, with the bytes reserved for it."""
        return scan_tmp(os.path.join(self.root, "tmp"))

    def _live(self, t: TempFile) -> bool:
        """Whether someone fills or reads the temp file ``t`` now (holds a lease on it)."""
        if t.retired:
            return False
        fd = try_lock_existing(t.path)
        if fd is None:
            return os.path.exists(t.path)
        os.close(fd)
        return False

    def _sweep(self) -> int:
        """Remove the given-up temp files nobody reads; the bytes the others hold (a dead
        fill's file stays: its verified pieces are resumed). Called under the eviction lock."""
        held = 0
        for t in list(self.parts()):
            if not t.retired or not self._retire(t.path):
                held += t.size
        return held

    def _retire(self, path: str) -> bool:
        """Remove the temp file ``path`` unless a reader holds it (then a ``.part`` is
        renamed aside, its name free for a new download); True if it is gone. Called
        under the eviction lock."""
        fd = try_lock_existing(path)
        if fd is None:
            ino = inode_of(path)
            if ino is not None and path.endswith(".part"):
                os.replace(path, f"{path}.gone-{ino}")
            return ino is None
        try:
            os.unlink(path)
        finally:
            os.close(fd)  # after the unlink: nobody could lease it in between
        return True

    def _evict(self, need: int) -> int:
        """Evict unleased shards, least recently used first, to free ``need`` bytes; if
        that many cannot be freed, evict nothing. Returns the bytes freed.
        """
        try:
            return self._evict_lru(need)
        except Stale as exc:  # a file the ledger lists is gone: count again, then evict
            self.ledger().rescan(str(exc))
            return self._evict_lru(need)

    def _evict_lru(self, need: int) -> int:
        taken: list[tuple[int, CachedShard]] = []
        freed = 0
        ledger = self.ledger()
        listed = (
            CachedShard(os.path.join(self.root, rel), size, mtime / 1e9)
            for rel, size, mtime in ledger.oldest(self._stat)
        )
        dead = sorted(self._dead_parts(), key=lambda s: s.mtime)
        try:
            for shard in heapq.merge(listed, dead, key=lambda s: s.mtime):
                if freed >= need:
                    break
                fd = try_lock_existing(shard.path)
                if fd is not None:  # None: someone holds a lease, it is being read
                    taken.append((fd, shard))
                    freed += shard.size
            listed.close()  # the ledger's order is back in place before it is changed
            if freed < need:
                return 0
            mine, taken = taken, []
            self._unlink(mine)
            return freed
        finally:
            for fd, _ in taken:
                os.close(fd)

    def _unlink(self, taken: list[tuple[int, CachedShard]]) -> None:
        """Remove files locked for eviction, logged in the ledger; closes their locks
        (the bytes are gone once this last fd on them is closed)."""
        data = os.path.join(self.root, "data") + os.sep
        rels = [os.path.relpath(s.path, self.root) for _, s in taken if s.path.startswith(data)]
        ledger = self.ledger() if rels else None
        if ledger is not None:
            ledger.begin(dels=rels)
        try:
            for _, shard in taken:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(shard.path)
                    log.info("evicted %s", shard.path)
        finally:
            for fd, _ in taken:
                os.close(fd)
            if ledger is not None:
                ledger.end()

    def _dead_parts(self) -> Iterator[CachedShard]:
        """The temp files of fills that died (evicted like shards when room is needed); not
        one cut to its shard's size: that one is verified and being published."""
        for t in self.parts():
            if not t.retired:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(t.path)
                    if st.st_size == t.size:
                        yield CachedShard(t.path, t.size, st.st_mtime)

    def usage(self) -> int:
        """Bytes held: verified shards plus the reservations of temp files.

        Counted under the eviction lock, as a reservation counts them: no eviction, new
        temp file or publish falls between reading ``tmp/`` and ``data/``.
        """
        self.ensure()
        with self._lock(self.evict_lock_path()):
            return sum(p.size for p in self.parts()) + self.ledger().total
