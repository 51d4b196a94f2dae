"""One writer per output: a lock on an output directory's manifest and shard prefix.

Two builds (or :class:`~shardkit.write.writer.ShardWriter` s) into one directory with the
same manifest name or the same shard prefix would overwrite each other's shards and
manifest: the second is refused at once with a :class:`WriterError` naming the holder's pid
and host. The lock is an ``flock`` on a hidden file beside the output
(``.lock-{name}``), so it dies with its process (no stale lock after a kill) and works
across hosts where the shared filesystem passes ``flock`` on (NFSv4, Lustre, GPFS do).
The file is removed as the lock is let go (a locker checks that the file it locked is
still the one on disk), so a finished output holds no lock file.

A build's lock lends itself inside its thread: the build holds it and its own writer takes
it again. A lone writer's lends itself to nothing: a build, or a second writer, into an
output that a :class:`~shardkit.write.writer.ShardWriter` holds open is refused, from its
own thread as from another thread or process. A forked child does not inherit it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
from collections.abc import Iterable

from shardkit.errors import WriterError

__all__ = ["OutputLock", "pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a live writer's temp file is not ours to delete).
    A zombie (killed, not yet reaped: a SIGKILLed build's workers for a moment) runs no
    more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:  # no /proc (macOS), or gone since
        return True
    return state != [b"Z"]


# real path -> (fd, holders, holding thread, whether it lends itself inside that thread)
_HELD: dict[str, tuple[int, int, int, bool]] = {}
_GUARD = threading.Lock()
_HOOKED: list[bool] = []


def _forget_in_child() -> None:
    for fd, *_ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


def _holder(fd: int) -> str:
    """What the lock file says about its holder: ``pid N on host H``."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
    except OSError:
        text = []
    if len(text) >= 2:
        return f"pid {text[0]} on host {text[1]}"
    return "a process that has not written its pid yet"


def _try(path: str, what: str) -> int:
    """An fd holding the lock of ``path``, or a WriterError naming who holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise WriterError(
            f"{what} is being written by another build ({holder}): wait for it to end, "
            "or write to another -o"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _acquire(path: str, what: str, lends: bool) -> None:
    with _GUARD:
        held = _HELD.get(path)
        me = threading.get_ident()
        if held is not None and held[2] == me and held[3]:
            _HELD[path] = (held[0], held[1] + 1, me, held[3])
            return
        if held is not None and held[2] == me:
            raise WriterError(
                f"{what} is being written by a ShardWriter this thread holds open: close it "
                "first (one writer per output)"
            )
        if held is not None:
            raise WriterError(
                f"{what} is being written by another thread of this process "
                f"(pid {os.getpid()}): one writer per output"
            )
        if not _HOOKED:
            os.register_at_fork(after_in_child=_forget_in_child)
            _HOOKED.append(True)
        while True:
            fd = _try(path, what)
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it as it let go: lock the one there now
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        _HELD[path] = (fd, 1, me, lends)


def _release(path: str) -> None:
    with _GUARD:
        fd, count, thread, lends = _HELD[path]
        if count > 1:
            _HELD[path] = (fd, count - 1, thread, lends)
            return
        del _HELD[path]
        # removed while still held (a later locker checks it locked the file on disk),
        # so an output is left without lock files
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)  # the only description of this open: its flock goes with it


class OutputLock:
    """The locks of one output: ``names`` (a manifest name, a shard prefix) in ``out_dir``.

    ``acquire()`` takes them all or none, without waiting; ``release()`` lets them go.
    Also a context manager. ``lends``: a build's lock, which its own writer, in its thread,
    takes again; a lone writer's lends itself to nothing.
    """

    def __init__(self, out_dir: str, names: Iterable[str], *, lends: bool = True) -> None:
        self.out_dir = out_dir
        self.lends = lends
        self.paths = sorted({os.path.join(out_dir, f".lock-{n}") for n in names})
        self._taken: list[str] = []

    def acquire(self) -> OutputLock:
        os.makedirs(self.out_dir, exist_ok=True)
        try:
            for path in self.paths:
                real = os.path.realpath(path)
                _acquire(real, self.out_dir, self.lends)
                self._taken.append(real)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        while self._taken:
            _release(self._taken.pop())

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
