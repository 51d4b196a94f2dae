"""Reading a cached shard, or one still arriving: the read-along stream.

A :class:`CacheStream` reads ``[start, end)`` of one shard from whichever file holds it:
the verified file (a hit), or the temp file a download is writing right now, in this
process or another one (read-through: bytes flow to the reader while the shard
arrives). At the end of the bytes written so far it decides what comes next:

- the download is still running: wait for more (a condition in this process, short
  polls across processes);
- the shard was published: go on reading (it is the same file, renamed);
- a new temp file appeared (a retry, or a takeover after a crash): switch to it, and
  before handing out a byte of it check that the bytes already handed out are the same in
  the new file, so a reader never mixes two different downloads;
- the download failed verification: :class:`ChecksumError`; it died: take it over;
- it was not cached (no room, a full disk): read the rest straight from the remote.

Every file is read under a lease (a shared ``flock``) that keeps eviction off it.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterator
from typing import Protocol

from shardkit.cache.fill import Fill
from shardkit.cache.layout import inode_of
from shardkit.cache.store import CacheKey, CacheStore
from shardkit.errors import CacheError, ChecksumError
from shardkit.io.remote import ChunkStream
from shardkit.io.retry import Counters

__all__ = ["CacheStream", "StreamHost"]

_POLL_MAX = 0.02  # longest pause between two looks at another process's download
_COMPARE = 1 << 20


class StreamHost(Protocol):
    """What a stream needs from its opener."""

    store: CacheStore
    counters: Counters

    def take_over(self, key: CacheKey, url: str) -> Fill | None: ...

    def direct(self, url: str, start: int, end: int) -> Iterator[bytes]: ...


class CacheStream(io.RawIOBase):
    """``[start, end)`` of a shard from the cache (see the module docstring).

    The last bytes of the range are handed out only once the download they came from is
    verified (the shard is published); a range read of a shard still arriving therefore
    ends when the whole shard has arrived. Given ``fd``, a verified file, it is a hit.
    """

    def __init__(
        self,
        host: StreamHost,
        key: CacheKey,
        url: str,
        start: int,
        end: int,
        *,
        fd: int | None = None,
        fill: Fill | None = None,
    ) -> None:
        self._host = host
        self._store = host.store
        self._key = key
        self._url = url
        self._start = self._pos = start
        self._end = end
        self._fd = fd
        self._inode = os.fstat(fd).st_ino if fd is not None else None
        self._verified = fd is not None
        self._fill = fill
        self._old: int | None = None  # the previous file, until the new one is checked
        self._direct: ChunkStream | None = None
        self._final = False
        self._pause = 0.001

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b)[: max(0, self._end - self._pos)]
        while view:
            if self._direct is not None:
                n = self._direct.readinto(view)
                self._pos += n
                return n
            n = os.preadv(self._fd, [view], self._pos) if self._fd is not None else 0
            if n:
                if self._old is not None:
                    self._check_prefix()
                if self._pos + n == self._end and not self._verified:
                    self._await_verdict()
                self._pos += n
                self._final = False
                self._pause = 0.001
                return n
            self._advance()
        return 0

    def _look(self) -> str:
        """Where the shard's bytes are now: one of the actions below."""
        fill = self._fill
        if fill is not None:
            if fill.bypass:
                return "direct"
            if not fill.done:
                new_file = fill.inode is not None and fill.inode != self._inode
                return "switch-part" if new_file else "wait-fill"
            self._fill = None
            if fill.error is not None and inode_of(self._store.path(self._key)) is None:
                raise fill.error
        held = self._store.downloading(self._key)  # before looking for the published file
        published = inode_of(self._store.path(self._key))
        if published is not None:
            return "published" if published == self._inode else "switch-published"
        if held:
            part = inode_of(self._store.part_path(self._key))
            return "switch-part" if part is not None and part != self._inode else "wait"
        failed = self._store.failed_inode(self._key)
        if failed is not None and failed[0] == self._inode:
            raise ChecksumError(
                "the download differs from the manifest; not cached",
                url=self._url,
                expected=self._key.checksum,
                actual=failed[1],
            )
        return "take-over"  # nobody holds the download: it died, gave up or did not cache

    def _advance(self) -> None:
        """At the end of the bytes there are: wait, switch, take over, or fail."""
        action = self._look()
        if action == "published":
            self._verified = True
            if self._final:
                raise ChecksumError(
                    f"the cached file ends before byte {self._end}",
                    url=self._url,
                    expected=f"{self._key.size} bytes",
                )
            self._final = True  # read once more: it may have grown before it was renamed
        elif action in ("switch-part", "switch-published"):
            self._switch(action == "switch-published")
        else:
            self._wait_or_act(action, until_done=False)

    def _await_verdict(self) -> None:
        """Before the last bytes: wait until the download is verified, or raise."""
        while not self._verified:
            action = self._look()
            if action == "published":
                self._verified = True
            elif action == "switch-published":
                fd = self._open(self._store.path(self._key))
                if fd is not None:
                    self._compare(self._fd, fd, self._end)
                    os.close(fd)
                    self._verified = True
            elif action == "direct":
                return  # not cached: like any uncached range read, it cannot be verified
            else:
                self._wait_or_act("wait" if action == "switch-part" else action, until_done=True)

    def _wait_or_act(self, action: str, *, until_done: bool) -> None:
        fill = self._fill
        if action == "direct":
            self._go_direct()
        elif action == "take-over":
            self._fill = self._host.take_over(self._key, self._url)
        elif action == "wait-fill" and fill is not None:
            with fill.cond:
                fill.cond.wait_for(lambda: self._moved(fill, until_done), timeout=0.5)
        else:
            time.sleep(self._pause)
            self._pause = min(self._pause * 2, _POLL_MAX)

    def _moved(self, fill: Fill, until_done: bool) -> bool:
        if fill.done or fill.bypass:
            return True
        new_file = fill.inode is not None and fill.inode != self._inode
        return not until_done and (new_file or fill.written > self._pos)

    def _open(self, path: str) -> int | None:
        return self._store.lease(path)  # eviction skips a file being read

    def _let_go(self, fd: int) -> None:
        """Close ``fd``; a temp file given up while it was read can be removed now."""
        try:
            retired = self._store.is_retired(fd, self._key)
        except OSError:
            retired = False
        os.close(fd)
        if retired:
            with contextlib.suppress(OSError, CacheError):  # else the next reservation does it
                self._store.sweep()

    def _switch(self, published: bool) -> None:
        path = self._store.path(self._key) if published else self._store.part_path(self._key)
        fd = self._open(path)
        if fd is None:
            return
        if self._fd is not None:
            if self._pos > self._start and self._old is None:
                self._old = self._fd
            else:
                self._let_go(self._fd)
        self._fd, self._inode = fd, os.fstat(fd).st_ino
        self._verified = published
        self._final = False

    def _check_prefix(self) -> None:
        """The new file holds what the old one handed out, or it is a ChecksumError."""
        assert self._old is not None and self._fd is not None
        self._compare(self._old, self._fd, self._pos)
        self._let_go(self._old)
        self._old = None

    def _compare(self, a: int | None, b: int, stop: int) -> None:
        pos = self._start
        while a is not None and pos < stop:
            n = min(_COMPARE, stop - pos)
            if os.pread(a, n, pos) != os.pread(b, n, pos):
                raise ChecksumError(
                    f"a new download differs from bytes already read at {pos}..{pos + n}",
                    url=self._url,
                    expected=self._key.checksum,
                )
            pos += n

    def _go_direct(self) -> None:
        self._host.counters.add("uncached_reads")
        self._direct = ChunkStream(
            self._host.direct(self._url, self._pos, self._end), url=self._url
        )
        self._close_files()

    def _close_files(self) -> None:
        for fd in (self._fd, self._old):
            if fd is not None:
                self._let_go(fd)
        self._fd = self._old = None

    def close(self) -> None:
        if not self.closed:
            self._close_files()
            if self._direct is not None:
                self._direct.close()
        super().close()
