"""What each thread of this process is doing, so that a stall has a name.

A reader says where it is (:func:`at`: the shard it reads, and how to ask its byte offset),
and the io below it what it waits on (:func:`waiting`: a fetch, with its url
redacted and its attempt; a cache piece another process is filling, with the file and
byte whose lock that process holds). Nothing is sent anywhere while all goes well: the
loader's watchdog reads it when no batch came for a while, from its own threads directly
(:func:`snapshot`) and from worker processes through a small JSON file each rewrites every
``REPORT_EVERY`` seconds into a directory the loader named before they started
(:func:`watch_from`, :func:`reports`); with a ``stacks`` file in that directory each worker
also dumps its threads' Python stacks there (:mod:`faulthandler`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from shardkit.errors import redact

__all__ = ["at", "left", "lock_holders", "reports", "snapshot", "waiting", "watch_from"]

REPORT_EVERY = 0.5
_THREADS: dict[int, dict[str, Any]] = {}
_WATCH: dict[str, Any] = {}  # "dir" and "pid" of the loader that watches, "thread" started
_FORKS: list[bool] = []


def _mine() -> dict[str, Any]:
    me = _THREADS.get(threading.get_ident())
    if me is None:
        me = _THREADS[threading.get_ident()] = {"thread": threading.current_thread().name}
        _report_from_here()
    return me


def at(shard: str, offset: Callable[[], int]) -> None:
    """This thread's reader reads ``shard``; ``offset()`` says at which byte (asked only
    when a report is made: nothing is done per sample)."""
    me = _mine()
    me["shard"] = shard
    me["offset"] = offset


def left(offset: Callable[[], int]) -> None:
    """This thread's reader that said :func:`at` with ``offset`` is done with its shard:
    a report no longer names it (another reader's later :func:`at` is kept)."""
    me = _THREADS.get(threading.get_ident())
    if me is not None and me.get("offset") is offset:
        me.pop("shard", None)
        me.pop("offset", None)


class waiting:
    """This thread waits on ``what`` (``"fetch"``, ``"cache fill"``) inside each ``with``
    block; ``detail`` may be updated between blocks (an attempt's number)."""

    def __init__(self, what: str, **detail: Any) -> None:
        if "url" in detail:
            detail["url"] = redact(str(detail["url"]))
        self.detail = {"what": what, **detail}
        self._before: list[Any] = []

    def __enter__(self) -> waiting:
        me = _mine()
        self._before.append(me.get("wait"))
        me["wait"] = {**self.detail, "since": time.time()}
        return self

    def __exit__(self, *exc: object) -> None:
        _mine()["wait"] = self._before.pop()


def snapshot() -> list[dict[str, Any]]:
    """What every thread of this process that read or waited is doing now."""
    alive = {t.ident for t in threading.enumerate()}
    for ident in [i for i in _THREADS if i not in alive]:
        _THREADS.pop(ident, None)
    out = []
    for v in list(_THREADS.values()):
        row = dict(v)
        if callable(row.get("offset")):
            try:
                row["offset"] = int(row["offset"]())
            except (OSError, ValueError, AttributeError):  # closed under the report: unknown
                row["offset"] = None
        out.append(json.loads(json.dumps(row, default=str)))
    return out


def watch_from(directory: str | None) -> None:
    """Worker processes started from now on report into ``directory`` (None: stop)."""
    if not _FORKS:  # a forked child starts with no thread of its own recorded
        os.register_at_fork(after_in_child=_THREADS.clear)
        _FORKS.append(True)
    _WATCH.clear()
    if directory is not None:
        _WATCH.update(dir=directory, pid=os.getpid())


def _report_from_here() -> None:
    """Start this process's reporter thread if it is a watched worker process."""
    where = _WATCH.get("dir")
    if where is None or _WATCH.get("pid") == os.getpid() or _WATCH.get("thread") == os.getpid():
        return
    _WATCH["thread"] = os.getpid()
    threading.Thread(target=_report, args=(where,), name="shardkit-activity", daemon=True).start()


def _report(where: str) -> None:
    mine = os.path.join(where, f"w-{os.getpid()}")
    while os.path.isdir(where):
        with contextlib.suppress(OSError):
            with open(mine + ".tmp", "w") as f:
                json.dump({"pid": os.getpid(), "threads": snapshot(), "at": time.time()}, f)
            os.replace(mine + ".tmp", mine + ".json")
            if os.path.exists(os.path.join(where, "stacks")) and not os.path.exists(
                mine + ".stacks"
            ):
                with open(mine + ".stacks.tmp", "w") as f:
                    faulthandler.dump_traceback(f, all_threads=True)
                os.replace(mine + ".stacks.tmp", mine + ".stacks")
        time.sleep(REPORT_EVERY)


def reports(directory: str) -> dict[int, dict[str, Any]]:
    """The latest report of each worker process, by pid (``stacks`` where dumped)."""
    out: dict[int, dict[str, Any]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith("w-") and name.endswith(".json")):
                continue
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(directory, name)) as f:
                    rep = json.load(f)
                stacks = os.path.join(directory, name[: -len(".json")] + ".stacks")
                if os.path.exists(stacks):
                    with open(stacks) as f:
                        rep["stacks"] = f.read()
                out[int(rep["pid"])] = rep
    return out


def lock_holders(path: str, byte: int, *, besides: int = 0) -> list[int]:
    """The pids holding a lock on byte ``byte`` of the file ``path`` (``/proc/locks``); an
    open file description lock shows no pid there, and then the pids that have the file
    open, other than ``besides``, are named (one of them holds it)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            rows = f.read().splitlines()
    except OSError:
        return []
    inode = f":{st.st_ino}"
    found = []
    for row in rows:
        parts = row.replace("->", "").split()
        if len(parts) < 8 or not parts[5].endswith(inode):
            continue
        start, end = parts[6], parts[7]
        if int(start) <= byte and (end == "EOF" or byte <= int(end)):
            with contextlib.suppress(ValueError):
                found.append(int(parts[4]))
    if found and all(pid > 0 for pid in found):
        return found
    return _openers((st.st_dev, st.st_ino), besides) if found else []


def _openers(file: tuple[int, int], besides: int) -> list[int]:
    """The pids with ``file`` (device, inode) open (``/proc/PID/fd``), ``besides`` not."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == besides:
            continue
        with contextlib.suppress(OSError):
            fds = os.path.join("/proc", entry, "fd")
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(fds, fd))
                    if (st.st_dev, st.st_ino) == file:
                        pids.append(int(entry))
                        break
    return pids
