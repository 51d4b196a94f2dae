"""A stall has a name: when no batch reaches the training loop for ``stall_warn`` seconds,
the loader's watchdog says, for each worker, where its reader is (rank, worker, shard and
byte offset of its latest sample) and what it waits on: a fetch (its url redacted, its
attempt, for how long), a cache piece another process is filling (and that process's pid),
or nothing of io (it decodes or computes). The report is logged as a warning, counted
(``stalls`` in ``stats()``, the Prometheus export's ``stalls_total``), and kept
(``stats()["stall"]``); with ``stall_stacks=True`` the workers' Python stacks
(:mod:`faulthandler`) are logged with it. A stall that goes on is reported again every
``stall_warn`` seconds. What each worker does comes from :mod:`shardkit.activity`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import numbers
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit import activity
from shardkit.errors import ConfigError, redact

__all__ = ["StallWatch"]

log = logging.getLogger(__name__)


class StallWatch:
    """The loader's watchdog (see the module docstring).

    Args:
        warn: seconds without a batch before a stall is reported (None: never).
        stacks: log the workers' Python stacks with each report.
    """

    def __init__(self, warn: float | None, stacks: bool = False) -> None:
        if warn is not None and (
            isinstance(warn, bool | np.bool_)
            or not isinstance(warn, numbers.Real)
            or not warn > 0  # NaN too
        ):
            raise ConfigError(f"stall_warn must be > 0 seconds or None, got {warn!r}")
        if not isinstance(stacks, bool | np.bool_):
            raise ConfigError(f"stall_stacks must be True or False, got {stacks!r}")
        self.warn = None if warn is None else float(warn)
        self.stacks = bool(stacks)
        self.stalls = 0
        self.last: list[dict[str, Any]] = []
        self._dir: str | None = None
        self._beat = time.monotonic()
        self._stop: threading.Event | None = None
        self._rank = 0
        self._workers: Callable[[], object] = _none

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stop": None, "_workers": _none}

    def prepare(self) -> None:
        """Before worker processes start: they will report into this watch's directory."""
        if self.warn is None:
            return
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix="shardkit-stall-")
            # gone with the loader (or at exit): its workers' reporters stop with it
            weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        activity.watch_from(self._dir)

    def begin(self, rank: int, workers: object, epoch: object) -> None:
        """An epoch starts: watch it while ``epoch`` (the loader's iteration) lives.

        ``workers`` is the DataLoader's iterator (its ``_workers``: the worker processes, in
        worker order). Both are held weakly: an epoch dropped unfinished, even one never
        started (its ``finally`` never runs), stops its watch, and the watch never keeps
        its worker processes alive (it did: they ran, and the watch reported 300 s stalls,
        until the process exited)."""
        if self.warn is None:
            return
        self.end()
        self._rank, self._workers = rank, _weak(workers)
        self.beat()
        stop = self._stop = threading.Event()
        # the thread holds this reference, so its callback runs when the epoch is dropped
        dropped = weakref.ref(epoch, lambda _: stop.set())
        args = (stop, dropped)
        threading.Thread(target=self._run, args=args, name="shardkit-stall", daemon=True).start()

    def beat(self) -> None:
        """A batch arrived."""
        self._beat = time.monotonic()

    def end(self) -> None:
        """The epoch ended (or was left): stop watching, and let go of its workers."""
        self._workers = _none
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def close(self) -> None:
        self.end()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self, stop: threading.Event, epoch: weakref.ref[object]) -> None:
        """Watch until ``stop`` is set: the epoch ended, or ``epoch`` was dropped."""
        assert self.warn is not None
        told = self._beat
        while not stop.wait(min(1.0, self.warn / 4)):
            quiet = time.monotonic() - self._beat
            if quiet >= self.warn and time.monotonic() - max(told, self._beat) >= self.warn:
                told = time.monotonic()
                pids = [p.pid for p in getattr(self._workers(), "_workers", ())]
                if stop.is_set():
                    return  # the epoch ended meanwhile: nothing stalls
                with contextlib.suppress(Exception):  # a report never breaks the loader
                    self.report(quiet, pids)

    def report(self, quiet: float, pids: list[int]) -> list[dict[str, Any]]:
        """Say what every worker is at now (``pids``: the worker processes, in worker
        order; none: this process's threads), logged, counted and kept; the rows."""
        stacks = self._ask_stacks(pids) if self.stacks else {}
        rows: list[dict[str, Any]] = []
        if pids and self._dir is not None:
            reports = activity.reports(self._dir)
            for w, pid in enumerate(pids):
                threads = reports.get(pid, {}).get("threads") or [{}]
                rows += [self._row(w, pid, t) for t in threads]
        else:  # 0 workers or thread workers: this process's threads
            rows = [self._row(None, os.getpid(), t) for t in activity.snapshot()]
            if self.stacks:
                stacks[os.getpid()] = _own_stacks()
        self.stalls += 1
        self.last = rows
        lines = "; ".join(_describe(r) for r in rows) or "no reader has started"
        log.warning("no batch for %.1f s (stall_warn=%g): %s", quiet, self.warn or 0.0, lines)
        for pid, text in stacks.items():
            log.warning("stacks of pid %d:\n%s", pid, text)
        return rows

    def _row(self, worker: int | None, pid: int, t: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"rank": self._rank, "worker": worker, "pid": pid}
        row["thread"] = t.get("thread")
        if t.get("shard") is not None:
            row["shard"], row["offset"] = redact(str(t["shard"])), t.get("offset")
        wait = t.get("wait")
        if not wait:
            row["waits"] = "decode" if t else "unknown (no report from the worker)"
            return row
        row["waits"] = wait["what"]
        row["for_s"] = round(time.time() - float(wait.get("since", time.time())), 1)
        for k in ("url", "attempt", "of", "byte"):
            if k in wait:
                row[k] = wait[k]
        if "shard" not in row and wait["what"] == "fetch":  # its first bytes: there
            row["shard"], row["offset"] = wait.get("url"), wait.get("offset")
        if wait["what"] == "cache fill" and "file" in wait:
            row["held_by"] = activity.lock_holders(
                str(wait["file"]), int(wait["byte"]), besides=pid
            )
        return row

    def _ask_stacks(self, pids: list[int]) -> dict[int, str]:
        """Each worker process's Python stacks (it dumps them within a report period)."""
        if self._dir is None:
            return {}
        flag = os.path.join(self._dir, "stacks")
        open(flag, "w").close()
        try:
            wanted = set(pids)
            until = time.monotonic() + 3 * activity.REPORT_EVERY + 1
            got: dict[int, str] = {}
            while time.monotonic() < until and set(got) < wanted:
                got = {
                    pid: r["stacks"]
                    for pid, r in activity.reports(self._dir).items()
                    if "stacks" in r and pid in wanted
                }
                time.sleep(0.05)
            return got
        finally:
            os.remove(flag)
            for name in os.listdir(self._dir):
                if name.endswith(".stacks"):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(self._dir, name))


def _none() -> None:
    """No workers (a watch between epochs)."""
    return None


def _weak(workers: object) -> Callable[[], object]:
    """A weak reference to ``workers``, or a strong one where it takes none."""
    try:
        return weakref.ref(workers)
    except TypeError:
        return lambda: workers


def _own_stacks() -> str:
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


def _describe(r: dict[str, Any]) -> str:
    who = f"rank {r['rank']} worker {r['worker'] if r['worker'] is not None else r['thread']}"
    who += f" (pid {r['pid']})"
    where = f" at {r['shard']} byte {r['offset']}" if "shard" in r else ""
    what = r["waits"]
    if what == "fetch":
        what = f"fetch of {r.get('url')} (attempt {r.get('attempt')}, {r.get('for_s')} s)"
    elif what == "cache fill":
        held = ", ".join(map(str, r.get("held_by") or [])) or "another process"
        what = f"cache fill of {r.get('url')} ({r.get('of')}) held by pid {held}"
    return f"{who}{where} waits on {what}"
