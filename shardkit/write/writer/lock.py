"""One writer per output: a lock on an output directory's manifest and shard prefix.

Two builds (or :class:`~shardkit.write.writer.ShardWriter` s) into one directory with the
same manifest name or the same shard prefix would overwrite each other's shards and
manifest: the second is refused at once with a :class:`WriterError` naming the holder's pid
and host. The lock is an ``flock`` on a hidden file beside the output
(``.lock-{name}``), so it dies with its process (no stale lock after a kill) and works
across hosts where the shared filesystem passes ``flock`` on (NFSv4, Lustre, GPFS do).
The file is removed as the lock is let go (a locker checks that the file it locked is
still the one on disk), so a finished output holds no lock file.

Inside a process a lock is held by an object, not by a thread (:class:`Holder`, the rule
the object-store lock follows too). A build's lock is held by the target it was taken
through and lends itself to the writer the build opens on that same target. A lone writer's
is held by the writer and lends itself to nothing: a build, or a second writer, into an
output that a :class:`~shardkit.write.writer.ShardWriter` holds open is refused, from its
own thread as from another thread or process. A writer dropped unclosed (collected after a
raise mid-write) lets its lock go, as a killed process's goes. A forked child does not
inherit it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardkit.errors import WriterError

__all__ = ["Holder", "OutputLock", "pid_alive"]


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


@dataclass(eq=False)
class Holder:
    """Who holds an output's lock in this process: a lone writer (``owner``), or a build,
    held by the target ``via`` which it lends itself to (the build's own writer opens on that
    target). Weak references: a holder collected unclosed holds nothing."""

    via: weakref.ref[object]
    owner: weakref.ref[object] | None = None
    thread: int = field(default_factory=threading.get_ident)

    @classmethod
    def of(cls, via: object, owner: object | None) -> Holder:
        return cls(weakref.ref(via), None if owner is None else weakref.ref(owner))

    def alive(self) -> bool:
        return (self.owner or self.via)() is not None

    def lends_to(self, via: object) -> bool:
        """Whether a lock taken through ``via`` is this build's own writer's."""
        return self.owner is None and self.via() is via

    def refuse(self, what: str) -> WriterError:
        """The error for another lock of what this live holder holds."""
        kind = "build" if self.owner is None else "ShardWriter"
        if self.thread == threading.get_ident():
            # a writer that raised mid-write lives on in the traceback a caller (a notebook)
            # keeps: nothing else would name how to let it go
            kept = "" if self.owner is None else "; or let go of an exception raised while it wrote"
            return WriterError(
                f"{what} is being written by a {kind} this thread holds open: close it first "
                f"(one writer per output{kept}: its traceback holds the writer)"
            )
        return WriterError(
            f"{what} is being written by another thread of this process (pid {os.getpid()}, "
            f"a {kind}): one writer per output; close it or wait for it to end"
        )


# real path -> (fd, times taken, holder)
_HELD: dict[str, tuple[int, int, Holder]] = {}
_GUARD = threading.RLock()  # a writer collected while held lets its lock go (finalizer)
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


def _acquire(path: str, what: str, holder: Holder) -> Holder:
    """Lock ``path`` for ``holder``; the holder it is held by (another one: lent)."""
    with _GUARD:
        held = _HELD.get(path)
        if held is not None and held[2].alive():
            if not held[2].lends_to(holder.via()):
                raise held[2].refuse(what)
            _HELD[path] = (held[0], held[1] + 1, held[2])
            return held[2]
        if held is not None:  # its holder was collected unclosed (its finalizer is behind)
            _drop(path)
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
        _HELD[path] = (fd, 1, holder)
        return holder


def _release(path: str, holder: Holder) -> None:
    """Let ``path`` go once for ``holder`` (nothing if another holds it now)."""
    with _GUARD:
        held = _HELD.get(path)
        if held is None or held[2] is not holder:
            return
        if held[1] > 1:
            _HELD[path] = (held[0], held[1] - 1, holder)
            return
        _drop(path)


def _drop(path: str) -> None:
    fd = _HELD.pop(path)[0]
    # removed while still held (a later locker checks it locked the file on disk), so an
    # output is left without lock files
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)  # the only description of this open: its flock goes with it


class OutputLock:
    """The locks of one output: ``names`` (a manifest name, a shard prefix) in ``out_dir``.

    ``acquire()`` takes them all or none, without waiting; ``release()`` lets them go.
    Also a context manager. Taken through the target ``via``; ``owner``: the lone writer
    holding it, which lends it to nothing and lets it go when collected unclosed; without
    one, a build's lock, which the build's own writer (opened on ``via``) takes again.
    """

    def __init__(
        self, out_dir: str, names: Iterable[str], *, via: object, owner: object | None = None
    ) -> None:
        self.out_dir = out_dir
        self.paths = sorted({os.path.join(out_dir, f".lock-{n}") for n in names})
        self._holder = Holder.of(via, owner)
        self._taken: list[tuple[str, Holder]] = []
        if owner is not None:  # dropped unclosed, it goes as a killed process's does
            weakref.finalize(owner, self.release)

    def acquire(self) -> OutputLock:
        os.makedirs(self.out_dir, exist_ok=True)
        try:
            for path in self.paths:
                real = os.path.realpath(path)
                self._taken.append((real, _acquire(real, self.out_dir, self._holder)))
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        while self._taken:
            _release(*self._taken.pop())

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
