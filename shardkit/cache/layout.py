"""What the cache holds and where: keys, records, and small helpers on its files."""

from __future__ import annotations

import errno
import fcntl
import os
import re
from dataclasses import dataclass
from typing import NamedTuple

from shardkit.checksum import split_checksum
from shardkit.errors import ConfigError

__all__ = [
    "CacheKey",
    "CacheStat",
    "CachedShard",
    "TempFile",
    "inode_of",
    "listdir",
    "try_lock_existing",
]

_HEX = re.compile(r"[0-9a-f]{16,128}")


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


class TempFile(NamedTuple):
    """A temp file in ``tmp/``: a download's (``retired`` False) or one given up."""

    path: str
    name: str  # the key's name: its download lock is ``locks/<name>.lock``
    size: int  # the bytes reserved for it
    retired: bool


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


def inode_of(path: str) -> int | None:
    """The inode ``path`` names now, or None if it names nothing."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def listdir(path: str) -> list[str]:
    """The names in ``path``; none if it is missing or not a directory."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return []
        raise
