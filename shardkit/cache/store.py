"""The cache directory: content-addressed shards, temp files, leases, LRU eviction.

Layout under the cache root (shared by every process and job that names it)::

    data/<algo>/<hex[:2]>/<hex>         verified shards, addressed by checksum
    tmp/<algo>-<hex>-<size>.part        a download in progress (its size is reserved)
    tmp/<algo>-<hex>-<size>.part.gone-N a given-up temp file a reader still holds (counted)
    tmp/<algo>-<hex>.failed             the inode of a download that failed verification
    locks/<algo>-<hex>.lock             held (flock) by the one process downloading it
    locks/evict.lock                    serialises reservations and evictions
    slots/slot-NNN.lock                 the per-node request cap

A shard becomes visible in ``data/`` only by ``os.replace`` after its size and checksum
were verified, so a crash or SIGKILL never leaves a file that is later served as whole.
Readers hold a shared ``flock`` (a *lease*) on the file they read; eviction takes an
exclusive one without waiting and skips a shard it cannot get. A download closes its temp
file before it publishes it, so a shard in ``data/`` is held only by its readers. A temp
file whose download lock is not held belongs to a dead process and is removed by the
next reservation.

Everything that changes what the cache holds runs under the eviction lock: reservations,
evictions and giving up temp files hold it exclusively, publishing holds it shared, so a
reservation counts shards and temp files at one instant (a shard being renamed from
``tmp/`` to ``data/`` is never counted twice, nor missed).

The limit holds for the bytes on disk, not only for the names: a file is unlinked only
under an exclusive ``flock`` taken under the eviction lock, and leases are taken under that
lock too (shared), so no process can be between opening a file and leasing it when it is
unlinked, and no unlinked file keeps bytes that the cache no longer counts. A temp file
given up while a reader still holds it is renamed aside and stays counted until the last
reader lets go.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Iterator

from shardkit.cache.layout import (
    CachedShard,
    CacheKey,
    CacheStat,
    TempFile,
    inode_of,
    listdir,
    try_lock_existing,
)
from shardkit.cache.locks import is_locked, locked, try_lock
from shardkit.durable import fsync_dir
from shardkit.errors import CacheError

__all__ = ["CacheKey", "CacheStat", "CacheStore", "CachedShard", "TempFile"]

log = logging.getLogger(__name__)
_PART = re.compile(r"(?P<name>[a-z0-9_]+-[0-9a-f]+)-(?P<size>\d+)\.part(?P<gone>\.gone-\d+)?")
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# shardkit node-local shard cache\n"


class CacheStore:
    """One node-local cache directory (see the module docstring).

    Args:
        root: the cache directory (created on first use).
        limit: bytes the cache may hold, temp files included; None: no limit.
    """

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.root = os.path.abspath(root)
        self.limit = limit
        self._ready = False

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "limit": self.limit, "_ready": False}

    # -- paths ---------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the directory layout (a clear :class:`CacheError` if it cannot)."""
        if self._ready:
            return
        try:
            for sub in ("data", "tmp", "locks", "slots", "manifests"):
                os.makedirs(os.path.join(self.root, sub), exist_ok=True)
            tag = os.path.join(self.root, "CACHEDIR.TAG")
            if not os.path.exists(tag):
                with open(tag, "w") as f:
                    f.write(_TAG)
        except OSError as exc:
            raise CacheError(f"cannot use cache dir {self.root}: {exc.strerror}") from exc
        self._ready = True

    def path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "data", key.algo, key.digest[:2], key.digest)

    def part_path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "tmp", f"{key.name}-{key.size}.part")

    def lock_path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "locks", f"{key.name}.lock")

    def marker_path(self, key: CacheKey) -> str:
        return os.path.join(self.root, "tmp", f"{key.name}.failed")

    def evict_lock_path(self) -> str:
        return os.path.join(self.root, "locks", "evict.lock")

    # -- reading -------------------------------------------------------------------
    def lease(self, path: str) -> int | None:
        """Open ``path`` under a lease (a shared ``flock``); None if it is not there.

        Opened and locked under the eviction lock (shared), so no eviction falls between
        the two: a lease is never taken on a file that eviction has already unlinked.
        """
        self.ensure()
        with locked(self.evict_lock_path(), exclusive=False):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # never waits long: see the module docstring
            except BaseException:
                os.close(fd)
                raise
            return fd

    def open_published(self, key: CacheKey) -> int | None:
        """Open a verified shard with a lease (shared lock), or None if it is not cached."""
        fd = self.lease(self.path(key))
        if fd is not None:
            with contextlib.suppress(OSError):
                os.utime(fd)  # least recently used goes first
        return fd

    def try_download_lock(self, key: CacheKey) -> int | None:
        """The download lock of ``key`` if nobody holds it (an fd to :func:`unlock`)."""
        self.ensure()
        return try_lock(self.lock_path(key))

    def downloading(self, key: CacheKey) -> bool:
        return is_locked(self.lock_path(key))

    def failed_inode(self, key: CacheKey) -> tuple[int, str] | None:
        """The inode and checksum of the last download of ``key`` that failed to verify."""
        try:
            with open(self.marker_path(key)) as f:
                rec = json.load(f)
            return int(rec["inode"]), str(rec["actual"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def is_retired(self, fd: int, key: CacheKey) -> bool:
        """Whether ``fd`` holds a temp file of ``key`` that was given up and renamed aside."""
        st = os.fstat(fd)
        here = (inode_of(self.part_path(key)), inode_of(self.path(key)))
        return st.st_nlink > 0 and st.st_ino not in here

    # -- writing (the download lock of the key is held) ----------------------------
    def reserve(self, key: CacheKey) -> int | None:
        """Make room for ``key`` and create its temp file; its fd, or None if no room.

        Runs under the eviction lock: removes temp files of dead downloads, then evicts
        least recently used shards that nobody is reading until the new one fits, and only
        then creates the temp file.
        """
        self.ensure()
        if self.limit is not None and key.size > self.limit:
            return None
        part = self.part_path(key)
        with locked(self.evict_lock_path()):
            self._retire(part)  # a try of ours that failed, or a dead process's
            used = self._sweep() + sum(s.size for s in self.shards())
            if self.limit is not None and used + key.size > self.limit:
                used -= self._evict(used + key.size - self.limit)
                if used + key.size > self.limit:
                    return None
            return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def publish(self, key: CacheKey) -> None:
        """Make a verified temp file (synced and closed) visible as the cached shard."""
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with locked(self.evict_lock_path(), exclusive=False):  # not while bytes are counted
            os.replace(self.part_path(key), path)
        fsync_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.marker_path(key))

    def mark_failed(self, key: CacheKey, inode: int, actual: str) -> None:
        """Record that the temp file ``inode`` failed verification, and give it up."""
        rec = {"inode": inode, "actual": actual, "time": time.time()}
        tmp = self.marker_path(key) + f".{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, self.marker_path(key))
        self.discard(key)

    def discard(self, key: CacheKey) -> None:
        """Give up the temp file of ``key`` (closed by its download): removed, or renamed
        aside and still counted while readers hold it."""
        self.ensure()
        with locked(self.evict_lock_path()):
            self._retire(self.part_path(key))

    def sweep(self) -> None:
        """Remove the temp files that nobody downloads or reads any more."""
        self.ensure()
        with locked(self.evict_lock_path()):
            self._sweep()

    # -- accounting and eviction ---------------------------------------------------
    def shards(self) -> Iterator[CachedShard]:
        """Every verified shard in the cache."""
        data = os.path.join(self.root, "data")
        for algo in listdir(data):
            for sub in listdir(os.path.join(data, algo)):
                d = os.path.join(data, algo, sub)
                for name in listdir(d):
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(os.path.join(d, name))
                        yield CachedShard(os.path.join(d, name), st.st_size, st.st_mtime)

    def parts(self) -> Iterator[TempFile]:
        """Every temp file, with the bytes reserved for it."""
        tmp = os.path.join(self.root, "tmp")
        for name in listdir(tmp):
            m = _PART.fullmatch(name)
            if m is not None:
                path, retired = os.path.join(tmp, name), m.group("gone") is not None
                yield TempFile(path, m.group("name"), int(m.group("size")), retired)

    def _live(self, t: TempFile) -> bool:
        return not t.retired and is_locked(os.path.join(self.root, "locks", f"{t.name}.lock"))

    def _sweep(self) -> int:
        """Remove temp files nobody downloads or reads; the bytes the others hold.
        Called under the eviction lock."""
        held = 0
        for t in list(self.parts()):
            if self._live(t) or not self._retire(t.path):
                held += t.size
            elif not t.retired:
                log.info("removed %s left by a dead download", t.path)
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
        taken: list[tuple[int, CachedShard]] = []
        freed = 0
        try:
            for shard in sorted(self.shards(), key=lambda s: s.mtime):
                if freed >= need:
                    break
                fd = try_lock_existing(shard.path)
                if fd is not None:  # None: someone holds a lease, it is being read
                    taken.append((fd, shard))
                    freed += shard.size
            if freed < need:
                return 0
            for _, shard in taken:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(shard.path)
                    log.info("evicted %s", shard.path)
            return freed
        finally:
            for fd, _ in taken:
                os.close(fd)  # the bytes are gone once this last fd on them is closed

    def _evict_one(self, path: str) -> bool:
        fd = try_lock_existing(path)
        if fd is None:
            return False  # someone is reading it
        try:
            os.unlink(path)
            log.info("evicted %s", path)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def usage(self) -> int:
        """Bytes held: verified shards plus the reservations of temp files.

        Counted under the eviction lock, as a reservation counts them: no eviction, new
        temp file or publish falls between reading ``tmp/`` and ``data/``.
        """
        self.ensure()
        with locked(self.evict_lock_path()):
            return sum(p.size for p in self.parts()) + sum(s.size for s in self.shards())

    def stat(self) -> CacheStat:
        """What the cache holds: shards, bytes, shards being read, downloads, dead files."""
        shards = list(self.shards())
        in_use = 0
        if shards:
            self.ensure()  # its locks dir
            with locked(self.evict_lock_path(), exclusive=False):  # as leases are taken
                for s in shards:
                    fd = try_lock_existing(s.path)
                    if fd is None:
                        in_use += 1
                    else:
                        os.close(fd)
        parts = list(self.parts())
        live = [p for p in parts if self._live(p)]
        return CacheStat(
            root=self.root,
            shards=len(shards),
            bytes=sum(s.size for s in shards),
            in_use=in_use,
            downloading=len(live),
            downloading_bytes=sum(p.size for p in live),
            dead_temp_files=len(parts) - len(live),
            oldest_use=min((s.mtime for s in shards), default=None),
        )

    def clean(self, *, keep: int = 0) -> tuple[int, int]:
        """Evict unleased shards until at most ``keep`` bytes stay, and remove dead temp
        files; returns ``(shards evicted, bytes freed)``.
        """
        self.ensure()
        with locked(self.evict_lock_path()):
            self._sweep()
            shards = sorted(self.shards(), key=lambda s: s.mtime)
            total = sum(s.size for s in shards)
            n = freed = 0
            for s in shards:
                if total - freed <= keep:
                    break
                if self._evict_one(s.path):
                    n += 1
                    freed += s.size
            return n, freed
