"""The cache directory: content-addressed shards, temp files, leases, LRU eviction.

Layout under the cache root (shared by every process and job that names it)::

    data/<algo>/<hex[:2]>/<hex>         verified shards, addressed by checksum
    tmp/<algo>-<hex>-<size>.part        a download in progress (its size is reserved)
    tmp/<algo>-<hex>.failed             the inode of a download that failed verification
    locks/<algo>-<hex>.lock             held (flock) by the one process downloading it
    locks/evict.lock                    serialises reservations and evictions
    slots/slot-NNN.lock                 the per-node request cap

A shard becomes visible in ``data/`` only by ``os.replace`` after its size and checksum
were verified, so a crash or SIGKILL never leaves a file that is later served as whole.
Readers hold a shared ``flock`` (a *lease*) on the file they read; eviction takes an
exclusive one without waiting and skips a shard it cannot get. A temp file whose download
lock is not held belongs to a dead process and is removed by the next reservation.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from shardkit.cache.locks import is_locked, locked, try_lock
from shardkit.checksum import split_checksum
from shardkit.errors import CacheError, ConfigError

__all__ = ["CacheKey", "CacheStat", "CacheStore", "CachedShard"]

log = logging.getLogger(__name__)
_HEX = re.compile(r"[0-9a-f]{16,128}")
_PART = re.compile(r"(?P<name>[a-z0-9_]+-[0-9a-f]+)-(?P<size>\d+)\.part")
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# shardkit node-local shard cache\n"


@dataclass(frozen=True)
class CacheKey:
    """Where a shard with a given checksum and size lives in the cache."""

    algo: str
    digest: str
    size: int

    @classmethod
    def of(cls, checksum: str, size: int) -> CacheKey:
        """The key of ``checksum`` (``algo:hex``); a digest that is not hex is refused."""
        algo, digest = split_checksum(checksum)
        if not _HEX.fullmatch(digest):
            raise ConfigError(f"checksum {checksum!r} is not a hex digest; cannot cache it")
        return cls(algo, digest, size)

    @property
    def name(self) -> str:
        return f"{self.algo}-{self.digest}"

    @property
    def checksum(self) -> str:
        return f"{self.algo}:{self.digest}"


@dataclass(frozen=True)
class CachedShard:
    """One verified shard in the cache."""

    path: str
    size: int
    mtime: float


@dataclass(frozen=True)
class CacheStat:
    """A look at a cache dir (``shardkit cache stat``)."""

    root: str
    shards: int
    bytes: int
    in_use: int
    downloading: int
    downloading_bytes: int
    dead_temp_files: int
    oldest_use: float | None


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

    # -- reading -------------------------------------------------------------------
    def open_published(self, key: CacheKey) -> int | None:
        """Open a verified shard with a lease (shared lock), or None if it is not cached."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
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

    # -- writing (the download lock of the key is held) ----------------------------
    def reserve(self, key: CacheKey) -> int | None:
        """Make room for ``key`` and create its temp file; its fd, or None if no room.

        Runs under the eviction lock: removes temp files of dead downloads, then evicts
        least recently used shards that nobody is reading until the new one fits.
        """
        self.ensure()
        if self.limit is not None and key.size > self.limit:
            return None
        part = self.part_path(key)
        with locked(os.path.join(self.root, "locks", "evict.lock")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            used = self._remove_dead_parts() + sum(s.size for s in self.shards())
            if self.limit is not None and used + key.size > self.limit:
                used -= self._evict(used + key.size - self.limit)
                if used + key.size > self.limit:
                    return None
            return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def publish(self, key: CacheKey, fd: int) -> None:
        """Make a verified temp file visible as the cached shard."""
        os.fsync(fd)
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(self.part_path(key), path)
        _sync_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.marker_path(key))

    def mark_failed(self, key: CacheKey, fd: int, actual: str) -> None:
        """Record that the temp file on ``fd`` failed verification, and remove it."""
        rec = {"inode": os.fstat(fd).st_ino, "actual": actual, "time": time.time()}
        tmp = self.marker_path(key) + f".{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, self.marker_path(key))
        self.discard(key)

    def discard(self, key: CacheKey) -> None:
        """Remove the temp file of ``key`` (readers holding it open keep their bytes)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.part_path(key))

    # -- accounting and eviction ---------------------------------------------------
    def shards(self) -> Iterator[CachedShard]:
        """Every verified shard in the cache."""
        data = os.path.join(self.root, "data")
        for algo in _listdir(data):
            for sub in _listdir(os.path.join(data, algo)):
                d = os.path.join(data, algo, sub)
                for name in _listdir(d):
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(os.path.join(d, name))
                        yield CachedShard(os.path.join(d, name), st.st_size, st.st_mtime)

    def parts(self) -> Iterator[tuple[str, str, int]]:
        """Every temp file: ``(path, key name, reserved size)``."""
        tmp = os.path.join(self.root, "tmp")
        for name in _listdir(tmp):
            m = _PART.fullmatch(name)
            if m is not None:
                yield os.path.join(tmp, name), m.group("name"), int(m.group("size"))

    def _remove_dead_parts(self) -> int:
        """Remove temp files nobody is downloading; the bytes reserved by live ones."""
        live = 0
        for path, name, size in list(self.parts()):
            if is_locked(os.path.join(self.root, "locks", f"{name}.lock")):
                live += size
            else:
                log.info("removing %s left by a dead download", path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return live

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
                os.close(fd)

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
        """Bytes held: verified shards plus the reservations of downloads in progress."""
        return sum(s.size for s in self.shards()) + sum(p[2] for p in self.parts())

    def stat(self) -> CacheStat:
        """What the cache holds: shards, bytes, shards being read, downloads, dead files."""
        shards = list(self.shards())
        in_use = 0
        for s in shards:
            fd = try_lock_existing(s.path)
            if fd is None:
                in_use += 1
            else:
                os.close(fd)
        parts = list(self.parts())
        live = [p for p in parts if is_locked(os.path.join(self.root, "locks", f"{p[1]}.lock"))]
        return CacheStat(
            root=self.root,
            shards=len(shards),
            bytes=sum(s.size for s in shards),
            in_use=in_use,
            downloading=len(live),
            downloading_bytes=sum(p[2] for p in live),
            dead_temp_files=len(parts) - len(live),
            oldest_use=min((s.mtime for s in shards), default=None),
        )

    def clean(self, *, keep: int = 0) -> tuple[int, int]:
        """Evict unleased shards until at most ``keep`` bytes stay, and remove dead temp
        files; returns ``(shards evicted, bytes freed)``.
        """
        self.ensure()
        with locked(os.path.join(self.root, "locks", "evict.lock")):
            self._remove_dead_parts()
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


def try_lock_existing(path: str) -> int | None:
    """An exclusive lock on an existing file without waiting (None: busy or gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _sync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort)."""
    with contextlib.suppress(OSError):
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return []
        raise
