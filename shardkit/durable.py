"""Durable writes, the one home: temp file in the same directory, fsync, rename, fsync the
directory. Used by the manifest, the writer, builds, from-shards and the cache."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable

__all__ = ["atomic_write", "fsync_dir"]


def atomic_write(path: str, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` to ``path`` durably: temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=directory)
    try:
        # mkstemp makes 0600; outputs are read by servers and colleagues: follow the umask
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray)):
                f.write(data)
            else:
                for chunk in data:
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable (best effort: not every filesystem can)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
