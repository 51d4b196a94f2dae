"""One build per object-store output: lock objects created with a conditional put.

A local output is locked with ``flock`` (:mod:`shardkit.write.writer.lock`), which dies with its
process. An object store has no such lock, so a build into ``s3://``, ``gs://`` or ``az://``
creates ``.lock-{manifest}`` and ``.lock-{prefix}-shards`` beside its output only where they
are not there (S3 ``If-None-Match: *``, GCS generation 0, Azure no overwrite: the store
decides, one of two racing builds wins), names its pid, host and times in them, renews them
every :data:`RENEW` seconds while it runs and deletes them when it ends. A second build
finds them and stops with a :class:`WriterError` naming the holder.

A lock outlives a build that was killed, so a lock is stale, and is taken over, when it
names a pid on this host that no longer runs (a killed build resumed on the same machine)
or when it was not renewed for :data:`LEASE` seconds (by the holder's clock: hosts whose
clocks are minutes apart shorten or lengthen that).

Inside a process the lock is held by an object, as a local folder's is
(:class:`~shardkit.write.writer.lock.Holder`): a build's by its target, lent to the writer
the build opens on it; a lone writer's by the writer, lent to nothing, so a build or a second
writer of its prefix is refused from its own thread too; a forked child inherits none (the
parent refuses it as another process). A writer dropped unclosed (collected
after a raise mid-write) stops renewing at once and makes no request (the store may be gone):
a new lock in this process takes its lock objects over at once (once a renewal already
under way has ended: landing later, it would put them back), another process once they were
not renewed for :data:`LEASE` seconds. Two builds taking over one stale lock
at the same instant can both succeed (deleting a stale lock is not conditional here); a
build paused past the lease can renew a lock another build has taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from shardkit.errors import WriterError
from shardkit.io.store_base import ObjectStore
from shardkit.write.writer.lock import Holder, pid_alive

__all__ = ["LEASE", "RENEW", "ObjectLock"]

log = logging.getLogger(__name__)

LEASE = 600.0  # a lock not renewed for this long belongs to a build that is gone
RENEW = 60.0


# a lock object named in full (endpoint, bucket, key) -> the lock of this process holding it
_HELD: dict[str, ObjectLock] = {}
_GUARD = threading.RLock()  # a refused reservation lets go of what it reserved under it
_HOOKED: list[bool] = []


def _forget_in_child() -> None:
    """A forked child holds none of its parent's locks: their lock objects name the
    parent, which refuses the child as another process."""
    global _GUARD
    _GUARD = threading.RLock()  # another thread of the parent may have held it at the fork
    _HELD.clear()


class ObjectLock:
    """Lock objects ``keys`` in ``store`` for one build of ``where`` (module docstring).

    Taken through the target ``via``. ``owner``: the lone writer holding it (lent to
    nothing; collected unclosed, it stops renewing and this process takes it over);
    without one, a build's lock, which the build's own writer (opened on ``via``) takes
    again, taking and deleting nothing.
    """

    def __init__(
        self,
        store: ObjectStore,
        keys: Sequence[str],
        where: str,
        *,
        via: object,
        owner: object | None = None,
    ) -> None:
        self.store = store
        self.keys = tuple(keys)
        self.where = where
        self._held_by = Holder.of(via, owner)
        self._mine: list[str] = []  # the keys this lock took (not held already)
        self.started = time.time()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        # the renewer holds this lock, never its owner: a writer dropped unclosed is
        # collected, and its lock objects are renewed no more
        weakref.finalize(owner if owner is not None else via, self._stop.set)

    def _body(self) -> bytes:
        doc = {"pid": os.getpid(), "host": socket.gethostname()}
        doc.update({"started": self.started, "renewed": time.time()})
        return json.dumps(doc).encode()

    def acquire(self) -> ObjectLock:
        """Take every lock object or none; a WriterError naming the holder if held."""
        todo, dropped = self._reserve()
        for old in {id(lock): lock for lock in dropped.values()}.values():
            old._halt()  # a renewal of the dropped lock under way lands before ours
        taken: list[str] = []
        stale: dict[tuple[Any, Any], list[str]] = {}  # holder taken over -> its lock objects
        try:
            for key in todo:
                holder = self._take(key, key in dropped)
                taken.append(key)
                if holder is not None:
                    stale.setdefault((holder.get("pid"), holder.get("host")), []).append(key)
        except BaseException:
            for key in taken:
                self.store.delete(key)
            self._forget(todo)
            raise
        for (pid, host), keys in stale.items():  # one line per lock, not per object
            whose = f"pid {pid} on host {host}"
            if self._ours({"pid": pid, "host": host}):
                whose = "a writer of this process dropped unclosed"
            log.warning("%s: taking over the stale lock of %s (%s)", self.where, whose,
                        ", ".join(keys))  # fmt: skip
        self._mine = taken
        if not taken:
            return self
        self._renewer = threading.Thread(target=self._renew, name="shardkit-lock", daemon=True)
        self._renewer.start()
        return self

    def _reserve(self) -> tuple[list[str], dict[str, ObjectLock]]:
        """The keys to take (those this process holds for a lock lending itself to ours
        are not), each reserved for this lock, and those of them a holder of this process
        dropped unclosed (with its lock); a WriterError if a live one of this process holds
        any."""
        todo: list[str] = []
        dropped: dict[str, ObjectLock] = {}
        with _GUARD:
            if not _HOOKED:
                os.register_at_fork(after_in_child=_forget_in_child)
                _HOOKED.append(True)
            for key in self.keys:
                held = _HELD.get(self._held_name(key))
                if held is not None and held._held_by.alive():
                    if held._held_by.lends_to(self._held_by.via()):
                        continue
                    self._forget(todo)
                    raise held._held_by.refuse(self.where)
                if held is not None:
                    dropped[key] = held
                _HELD[self._held_name(key)] = self
                todo.append(key)
        return todo, dropped

    def _held_name(self, key: str) -> str:
        """Lock object ``key`` in full: another store's bucket of the same name (another
        endpoint) is another object, its url text alone the same."""
        return self.store.location() + key

    def _forget(self, keys: Sequence[str]) -> None:
        """This process holds ``keys`` for this lock no more (another may hold them now)."""
        with _GUARD:
            for key in keys:
                if _HELD.get(self._held_name(key)) is self:
                    del _HELD[self._held_name(key)]

    def _take(self, key: str, dropped: bool) -> dict[str, Any] | None:
        """Create lock object ``key``; the stale holder it took over from, if any.
        ``dropped``: a holder of this process was collected holding it."""
        took_over = None
        for _ in range(3):
            if self.store.create(key, self._body()):
                return took_over
            holder = self._holder(key)
            if holder is None:
                continue  # let go between our put and our read: try again
            if not (dropped and self._ours(holder)) and not self._stale(holder):
                raise WriterError(
                    f"{self.where}: another build writes here (pid {holder.get('pid')} on host "
                    f"{holder.get('host')}, lock {self.store.url(key)}); wait for it, or "
                    "delete the lock object if that build is gone"
                )
            took_over = holder
            self.store.delete(key)
        raise WriterError(f"{self.where}: could not take the lock {self.store.url(key)}")

    def _holder(self, key: str) -> dict[str, Any] | None:
        data = self.store.get(key)
        if data is None:
            return None
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        return doc if isinstance(doc, dict) else {}

    @staticmethod
    def _ours(holder: dict[str, Any]) -> bool:
        return holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()

    def _stale(self, holder: dict[str, Any]) -> bool:
        renewed = holder.get("renewed")
        if not isinstance(renewed, (int, float)) or time.time() - renewed > LEASE:
            return True  # its holder is gone, or dropped its writer unclosed
        pid = holder.get("pid")
        return (
            holder.get("host") == socket.gethostname()
            and isinstance(pid, int)
            and (not pid_alive(pid))
        )

    def _renew(self) -> None:
        while not self._stop.wait(RENEW):
            for key in self._mine:
                if self._stop.is_set():
                    break
                try:
                    self.store.put(key, self._body())
                except Exception as exc:  # noqa: BLE001 - the next renewal tries again
                    log.warning("%s: could not renew the lock %s: %r", self.where, key, exc)

    def _halt(self) -> None:
        """Stop renewing and wait for a renewal under way: its put must not land after
        the lock objects were deleted or taken over."""
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()

    def release(self) -> None:
        """Stop renewing and delete the lock objects."""
        self._halt()
        self._renewer = None
        mine, self._mine = self._mine, []
        self._forget(mine)
        for key in mine:
            self.store.delete(key)

    def __enter__(self) -> ObjectLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()  # whether the block raised or not
