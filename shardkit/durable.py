"""Local files, the one home of how they are written and opened.

Durable writes: temp file in the same directory, fsync, rename, fsync the directory. Used
by the manifest, the writer, builds, from-shards and the cache.

Reads open only a regular file (:func:`open_regular`): a FIFO's ``open()`` waits for a
writer forever, and a device (``/dev/zero``) or a directory where a shard, an index or a
manifest should be is no such file either. It opens without waiting and refuses anything
else with an :class:`OSError` whose ``strerror`` says what it is, so each caller translates
it as any other failed open (a missing file, no permission).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable

__all__ = ["atomic_write", "fsync_dir", "open_regular"]


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


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def open_regular(path: str) -> int:
    """A blocking descriptor of the regular file at ``path``; anything else (a FIFO, a
    device, a directory) is an :class:`OSError` naming what it is."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer (no effect on a file)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = _KINDS.get(stat.S_IFMT(mode), "a device")
        raise OSError(errno.EINVAL, f"it is {what}, not a regular file", path)
    os.set_blocking(fd, True)
    return fd
