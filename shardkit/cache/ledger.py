"""The cache's ledger: what ``data/`` holds (each file's size and last use), so that a
reservation costs the same with 10 or 10,000 cached files instead of a scan of them all.

``ledger`` in the cache root is a log of lines ``<crc32 hex> <json>``: a header (format
version and the boot it was written in), then transactions, each a *begin* line (the files
added and removed) and an *end* line (applied, or not). It is read and written only under
the exclusive eviction lock, by the process that changes ``data/``: it appends the begin
line, renames or unlinks, then appends the end line. Every process keeps the entries in
memory and reads only what others appended since its last look (a compacted ledger, a new
inode, is read whole again).

Never trusted blindly. The ledger is rebuilt from a scan of ``data/`` (a *rescan*) when it
is missing, of another format, written before the machine last booted (a tail not yet on
disk may be lost), has a line that is cut or does not match its checksum (half-written),
or ends in a begin line without its end (a process died between the two: a file may be
published but not listed, or listed and gone); and when the disk is seen to disagree with
it: a shard opened that it does not list, a listed shard that is gone, a file it lists
missing when eviction comes to it. ``shardkit cache stat`` and ``clean`` rescan too.

Last use is the file's mtime (a hit touches it, without the lock), exactly as before the
ledger; eviction takes entries in the order their recorded time gives and stats each one
it comes to: one used since goes back in its new place, so the order is exact and costs a
stat per shard looked at, not per shard cached.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["Entry", "Ledger", "Stale"]

log = logging.getLogger(__name__)
_VERSION = 1
_COMPACT_MIN = 1 << 20  # bytes of log before a compaction is worth it

Entry = tuple[str, int, int]  # path relative to the root, size, mtime in ns


class Stale(Exception):
    """The disk disagrees with the ledger: rescan."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - Linux has it
        return "unknown"


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse(line: bytes) -> dict[str, Any] | None:
    """The record of one whole line, or None if it does not match its checksum."""
    crc, _, body = line.partition(b" ")
    try:
        if int(crc, 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class Ledger:
    """One process's view of a cache root's ledger (see the module docstring); every
    method is called under the exclusive eviction lock.

    Args:
        root: the cache root.
        scan: every file under ``data/`` now, for a rescan.
    """

    def __init__(self, root: str, scan: Callable[[], Iterable[Entry]]) -> None:
        self.path = os.path.join(root, "ledger")
        self.root = root
        self._scan = scan
        self._boot = _boot_id()
        self.rescans = 0
        self._reset()

    def _reset(self) -> None:
        self._fd: int | None = None
        self._pos = 0
        self.entries: dict[str, tuple[int, int]] = {}
        self.total = 0
        self._heap: list[tuple[int, str]] = []
        self._open: dict[str, Any] | None = None  # this process's begun transaction

    # -- reading -------------------------------------------------------------------
    def sync(self) -> None:
        """Catch up with what other processes appended; rescan if it cannot be trusted."""
        try:
            self._catch_up()
        except Stale as exc:
            self.rescan(str(exc))

    def _catch_up(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise Stale("no ledger yet") from None
        if self._fd is None or os.fstat(self._fd).st_ino != st.st_ino:
            self._close()
            self._reset()
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        if st.st_size == self._pos:
            return  # nobody changed anything: the common case, one stat
        if st.st_size < self._pos:
            raise Stale("a ledger cut shorter than it was")
        data = os.pread(self._fd, st.st_size - self._pos, self._pos)
        if not data.endswith(b"\n"):
            raise Stale("a half-written ledger line")
        pending: dict[str, Any] | None = None
        header = self._pos == 0  # the first line of the file, and only that one
        for raw in data.splitlines():
            rec = _parse(raw)
            if rec is None:
                raise Stale("a ledger line that does not match its checksum")
            if header != ("v" in rec):
                raise Stale("a ledger without its header")
            if header:
                if rec["v"] != _VERSION or rec.get("boot") != self._boot:
                    raise Stale("a ledger of another format or from before the last boot")
            elif "end" in rec:
                if pending is None:
                    raise Stale("a ledger transaction that ends without beginning")
                if rec["end"]:
                    self._apply(pending)
                pending = None
            elif pending is not None:
                raise Stale("a ledger transaction that never ended: a process died in it")
            else:
                pending = rec
            header = False
        if pending is not None:  # under the lock: whoever began it is gone
            raise Stale("a ledger transaction that never ended: a process died in it")
        if self._pos == 0:
            self._check_sizes()
        self._pos = st.st_size

    def _check_sizes(self) -> None:
        """A ledger read whole is checked against the files (a stat each): one edited,
        its checksums valid, must not let the cache grow past its limit."""
        for rel, (size, _) in self.entries.items():
            try:
                real = os.stat(os.path.join(self.root, rel)).st_size
            except FileNotFoundError:
                raise Stale(f"a shard it lists is gone ({rel})") from None
            if real != size:
                raise Stale(f"a shard's size differs from the ledger's ({rel})")

    def _apply(self, rec: dict[str, Any]) -> None:
        for rel in rec.get("del", ()):
            old = self.entries.pop(rel, None)
            if old is not None:
                self.total -= old[0]
        for rel, size, mtime in rec.get("add", ()):
            old = self.entries.get(rel)
            if old is not None:
                self.total -= old[0]
            self.entries[rel] = (int(size), int(mtime))
            self.total += int(size)
            heapq.heappush(self._heap, (int(mtime), rel))

    # -- writing -------------------------------------------------------------------
    def begin(self, *, add: Iterable[Entry] = (), dels: Iterable[str] = ()) -> None:
        """Log the changes about to be made to ``data/`` (before making them)."""
        assert self._fd is not None and self._open is None
        self._open = {"add": [list(a) for a in add], "del": list(dels)}
        self._append(_line(self._open))

    def end(self, ok: bool = True) -> None:
        """Log that the changes begun were made (``ok``) or not, and apply them."""
        rec, self._open = self._open, None
        assert rec is not None
        self._append(_line({"end": ok}))
        if ok:
            self._apply(rec)
        if self._pos > max(_COMPACT_MIN, 200 * len(self.entries)):
            self._write(self._snapshot())

    def _append(self, line: bytes) -> None:
        assert self._fd is not None
        os.write(self._fd, line)  # O_APPEND, one write: a crash leaves a cut line at most
        self._pos += len(line)

    def _snapshot(self) -> list[Entry]:
        return [(rel, size, mtime) for rel, (size, mtime) in self.entries.items()]

    def _write(self, entries: list[Entry]) -> None:
        """Replace the log by a header and one transaction holding ``entries``."""
        tmp = f"{self.path}.tmp-{os.getpid()}"
        body = (
            _line({"v": _VERSION, "boot": self._boot})
            + _line({"add": [list(e) for e in entries], "del": []})
            + _line({"end": True})
        )
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._close()
        self._reset()
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self._apply({"add": entries})
        self._pos = len(body)

    def rescan(self, why: str) -> None:
        """Rebuild the ledger from what ``data/`` holds now."""
        if why != "no ledger yet":
            log.warning("cache %s: %s; its ledger is rebuilt from a scan", self.root, why)
        self.rescans += 1
        self._write(list(self._scan()))

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None

    # -- least recently used ----------------------------------------------------------
    def oldest(self, stat_of: Callable[[str], tuple[int, int] | None]) -> Iterator[Entry]:
        """Listed files, least recently used first, by their mtime now (``stat_of``: size
        and mtime; None: the file is gone). :class:`Stale` if one is gone or its size is
        not the one listed."""
        if len(self._heap) > 2 * len(self.entries) + 64:
            self._heap = [(m, rel) for rel, (_, m) in self.entries.items()]
            heapq.heapify(self._heap)
        seen: list[tuple[int, str]] = []
        try:
            while self._heap:
                mtime, rel = heapq.heappop(self._heap)
                entry = self.entries.get(rel)
                if entry is None or entry[1] != mtime:
                    continue  # removed, or pushed again with a later use
                seen_now = stat_of(rel)
                if seen_now is None:
                    raise Stale(f"a shard it lists is gone ({rel})")
                size, now = seen_now
                if size != entry[0]:
                    raise Stale(f"a shard's size differs from the ledger's ({rel})")
                if now != mtime:  # used since it was logged: its place is later
                    self.entries[rel] = (entry[0], now)
                    heapq.heappush(self._heap, (now, rel))
                    continue
                seen.append((mtime, rel))
                yield rel, entry[0], mtime
        finally:
            for item in seen:
                heapq.heappush(self._heap, item)
