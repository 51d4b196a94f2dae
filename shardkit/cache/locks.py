"""File locks shared by every process on the node: ``flock``, which dies with its process.

``flock`` locks belong to an open file description, so two opens of one file conflict even
inside one process (threads included), and a killed process's locks vanish with it: no
pid files, nothing to recover by hand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator

from shardkit.errors import CacheError

__all__ = [
    "NodeSlots",
    "claim_byte",
    "is_locked",
    "lock_file",
    "open_shared",
    "try_lock",
    "try_lock_existing",
    "unlock",
    "wait_claim",
]

# Lock fds this process holds. A forked child (a DataLoader worker) inherits them, and an
# inherited copy would keep the lock alive after this process let go of it or died; the
# threads that own them do not exist in the child, so the child closes its copies.
log = logging.getLogger(__name__)

_HELD: set[int] = set()
_HELD_LOCK = threading.RLock()  # reentrant: a close() run by the GC may take it
_HOOKED: list[bool] = []


def _close_inherited() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


def _held(fd: int) -> int:
    with _HELD_LOCK:
        if not _HOOKED:
            os.register_at_fork(after_in_child=_close_inherited)
            _HOOKED.append(True)
        _HELD.add(fd)
    return fd


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def try_lock(path: str, *, exclusive: bool = True) -> int | None:
    """Lock ``path`` without waiting; the fd holding the lock, or None if it is taken."""
    fd = _open(path)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return _held(fd)


def lock_file(path: str, *, exclusive: bool = True) -> int:
    """Lock ``path``, waiting as long as it takes; the fd holding the lock."""
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return _held(fd)


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


def open_shared(path: str, flags: int) -> int | None:
    """Open ``path`` and take a shared lock on it (a lease); None if it is not there."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int) -> None:
    """Release a lock taken by :func:`try_lock` or :func:`lock_file`."""
    with _HELD_LOCK:
        _HELD.discard(fd)
    os.close(fd)  # closing the only fd of the description drops its flock


def is_locked(path: str) -> bool:
    """Whether some process holds an exclusive lock on ``path`` right now."""
    if not os.path.exists(path):
        return False
    fd = try_lock(path, exclusive=False)
    if fd is None:
        return True
    unlock(fd)
    return False


# struct flock on Linux (x86_64, aarch64): l_type, l_whence, l_start, l_len, l_pid
_FLOCK = "hhqqi4x"
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_SETLKW: int | None = getattr(fcntl, "F_OFD_SETLKW", None)
_SLOT_POLL = 0.005  # longest pause of the one waiter that looks for a free slot


def claim_byte(fd: int, offset: int) -> int | None:
    """Claim byte ``offset`` of the file ``fd`` is open on, without waiting.

    Returns a new read-write fd of that file holding the claim (an open file description
    lock, Linux's ``F_OFD_SETLK``: it conflicts with every other description, threads of
    this process included, and dies with its process), or None if someone holds it.
    Release it with :func:`unlock`.
    """
    if _OFD_SETLK is None:  # pragma: no cover - only Linux has OFD locks
        raise OSError(errno.ENOTSUP, "the node cache needs Linux open file description locks")
    mine = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)  # a description of its own
    try:
        fcntl.fcntl(mine, _OFD_SETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as exc:
        os.close(mine)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    except BaseException:
        os.close(mine)
        raise
    return _held(mine)


def wait_claim(fd: int, offset: int, timeout: float) -> bool:
    """Wait until nobody holds a claim on byte ``offset`` of the file ``fd`` (its holder
    let go, or died), at most ``timeout`` seconds; True if it was let go.

    No polling: a helper thread blocks on a read lock of that byte (``F_OFD_SETLKW``),
    which the kernel grants the moment the claim goes, whichever thread or process held
    it, and drops it at once. A wait that times out leaves the helper blocked until the
    claim goes (a holder's own requests are bounded by their deadline).
    """
    if _OFD_SETLKW is None:  # pragma: no cover - only Linux has OFD locks
        raise OSError(errno.ENOTSUP, "the node cache needs Linux open file description locks")
    mine = _held(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC))
    free = threading.Event()

    def block() -> None:
        try:
            lock = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, offset, 1, 0)
            fcntl.fcntl(mine, _OFD_SETLKW, lock)
        except OSError:
            pass  # the waiter looks at the map again and finds out for itself
        finally:
            unlock(mine)  # the read lock goes with its description, before the waiter runs
            free.set()

    threading.Thread(target=block, name="shardkit-claim-wait", daemon=True).start()
    return free.wait(timeout)


@contextlib.contextmanager
def locked(path: str, *, exclusive: bool = True) -> Iterator[int]:
    """Hold a lock on ``path`` (exclusive, or shared) for the block."""
    fd = lock_file(path, exclusive=exclusive)
    try:
        yield fd
    finally:
        unlock(fd)


class NodeSlots:
    """At most ``n`` remote requests at once on this node: ``n`` lock files as slots.

    The last ``reserve`` slots are kept for requests a reader waits on (``urgent``): the
    background (prefetch, the rest of a shard) never holds more than ``n - reserve``, so
    a reader's piece starts at once however much is being filled ahead.

    A request takes a free slot; if none is free it queues on its door lock (one for
    urgent requests, one for the background), and the request at the head of the queue
    takes the first slot that frees, whichever it is (``flock`` cannot wait for one of
    several files, so that one waiter looks every few milliseconds; waiting on one busy
    slot could wait for the longest request on the node while others end). A killed
    process's slots are free at once (its locks die with it).

    Every wait is bounded. A slot's file is touched when it is taken, and the head of the
    queue touches its door while it waits: a slot or a door held longer than ``lease``
    seconds (its holder stopped, SIGSTOP or a debugger, or hung) is taken over: its file
    is replaced by a fresh one, which the waiter locks (the stopped holder keeps a lock
    on a file nobody else sees). A request that finds no slot within ``wait`` seconds is
    a :class:`CacheError`.
    """

    def __init__(
        self, directory: str, n: int, reserve: int = 0, *, wait: float = 300.0, lease: float = 120.0
    ) -> None:
        self.directory = directory
        self.n = n
        self.reserve = min(reserve, n - 1) if n > 1 else 0
        self.wait = wait
        self.lease = lease

    @contextlib.contextmanager
    def slot(self, *, urgent: bool = False) -> Iterator[None]:
        """Hold one slot for the block."""
        os.makedirs(self.directory, exist_ok=True)
        mine = self.n if urgent else self.n - self.reserve
        paths = [os.path.join(self.directory, f"slot-{i:03d}.lock") for i in range(mine)]
        fd = _any_free(paths)
        if fd is None:
            door = os.path.join(self.directory, "door-urgent.lock" if urgent else "door.lock")
            fd = self._queue(door, paths, time.monotonic() + self.wait)
        _touch(fd)  # the lease starts
        try:
            yield
        finally:
            unlock(fd)

    def _queue(self, door: str, paths: list[str], until: float) -> int:
        """Wait at ``door`` for the head of the queue, then for a slot; the slot's fd."""
        head = self._take([door], until, lambda: None)
        try:  # the head touches its door as it waits: it is alive
            return self._take(paths, until, functools.partial(_touch, head))
        finally:
            unlock(head)

    def _take(self, files: list[str], until: float, beat: Callable[[], None]) -> int:
        """Lock any of ``files``, taking over a stale one, by ``until``."""
        pause = 0.0005
        while True:
            fd = _any_free(files)
            if fd is None:
                fd = next(filter(None, map(self._take_over, files)), None)
            if fd is not None:
                return fd
            if time.monotonic() >= until:
                raise CacheError(
                    f"waited {self.wait:g} s for one of the node's {self.n} request slots "
                    f"({self.directory}); every one is held"
                )
            beat()
            time.sleep(pause)
            pause = min(2 * pause, _SLOT_POLL)

    def _take_over(self, path: str) -> int | None:
        """Replace the lock file ``path`` if its holder has held it past the lease, and
        lock the fresh one; None if it is not stale (or someone else took it over)."""
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            return None
        if age < self.lease:
            return None
        fresh = f"{path}.new-{os.getpid()}-{threading.get_ident()}"
        os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        os.replace(fresh, path)
        fd = try_lock(path)
        if fd is None:
            return None
        if os.fstat(fd).st_ino != os.stat(path).st_ino:  # replaced again meanwhile
            unlock(fd)
            return None
        log.warning("took over %s: held for %.0f s (its holder is stopped or hung)", path, age)
        return fd


def _touch(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.utime(fd)


def _any_free(paths: list[str]) -> int | None:
    """A lock on one of ``paths`` (tried in random order), or None if all are taken."""
    tried = map(try_lock, random.sample(paths, len(paths)))
    return next((f for f in tried if f is not None), None)
