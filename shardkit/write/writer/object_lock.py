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
clocks are minutes apart shorten or lengthen that). Two builds taking over one stale lock
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
from collections.abc import Sequence
from typing import Any

from shardkit.errors import WriterError
from shardkit.io.store_base import ObjectStore
from shardkit.write.writer.lock import pid_alive

__all__ = ["LEASE", "RENEW", "ObjectLock"]

log = logging.getLogger(__name__)

LEASE = 600.0  # a lock not renewed for this long belongs to a build that is gone
RENEW = 60.0


_HELD: dict[str, int] = {}  # lock url -> the thread of this process holding it
_GUARD = threading.Lock()


class ObjectLock:
    """Lock objects ``keys`` in ``store`` for one build of ``where`` (module docstring).

    Inside one thread it is re-entrant (a build holds it and its own writer takes it
    again: the inner one takes and deletes nothing); another thread of the process is
    refused as another process is.
    """

    def __init__(self, store: ObjectStore, keys: Sequence[str], where: str) -> None:
        self.store = store
        self.keys = tuple(keys)
        self.where = where
        self._mine: list[str] = []  # the keys this lock took (not held already)
        self.started = time.time()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self) -> bytes:
        doc = {"pid": os.getpid(), "host": socket.gethostname()}
        doc.update({"started": self.started, "renewed": time.time()})
        return json.dumps(doc).encode()

    def acquire(self) -> ObjectLock:
        """Take every lock object or none; a WriterError naming the holder if held."""
        me = threading.get_ident()
        with _GUARD:
            todo = [k for k in self.keys if _HELD.get(self.store.url(k)) != me]
        taken: list[str] = []
        stale: dict[tuple[Any, Any], list[str]] = {}  # holder taken over -> its lock objects
        try:
            for key in todo:
                holder = self._take(key)
                taken.append(key)
                if holder is not None:
                    stale.setdefault((holder.get("pid"), holder.get("host")), []).append(key)
        except BaseException:
            for key in taken:
                self.store.delete(key)
            raise
        for (pid, host), keys in stale.items():  # one line per lock, not per object
            log.warning("%s: taking over the stale lock of pid %s on host %s (%s)",
                        self.where, pid, host, ", ".join(keys))  # fmt: skip
        with _GUARD:
            _HELD.update((self.store.url(k), me) for k in taken)
        self._mine = taken
        if not taken:
            return self
        self._renewer = threading.Thread(target=self._renew, name="shardkit-lock", daemon=True)
        self._renewer.start()
        return self

    def _take(self, key: str) -> dict[str, Any] | None:
        """Create lock object ``key``; the stale holder it took over from, if any."""
        took_over = None
        for _ in range(3):
            if self.store.create(key, self._body()):
                return took_over
            holder = self._holder(key)
            if holder is None:
                continue  # let go between our put and our read: try again
            if not self._stale(holder):
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

    def _stale(self, holder: dict[str, Any]) -> bool:
        pid = holder.get("pid")
        if holder.get("host") == socket.gethostname() and isinstance(pid, int):
            return not pid_alive(pid)
        renewed = holder.get("renewed")
        return not isinstance(renewed, (int, float)) or time.time() - renewed > LEASE

    def _renew(self) -> None:
        while not self._stop.wait(RENEW):
            for key in self._mine:
                try:
                    self.store.put(key, self._body())
                except Exception as exc:  # noqa: BLE001 - the next renewal tries again
                    log.warning("%s: could not renew the lock %s: %r", self.where, key, exc)

    def release(self) -> None:
        """Stop renewing and delete the lock objects."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        mine, self._mine = self._mine, []
        with _GUARD:
            for key in mine:
                _HELD.pop(self.store.url(key), None)
        for key in mine:
            self.store.delete(key)

    def __enter__(self) -> ObjectLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()  # whether the block raised or not
