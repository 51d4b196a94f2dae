"""Downloading a byte range of a remote shard into its cache file, at its offsets: over one
ranged request, several at once for a piece a reader waits for, or a run of consecutive
pieces in one request, each piece hashed as its bytes arrive; a write the disk refuses is a
:class:`WriteError`, and no byte past the range asked for is ever written."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from shardkit.cache.store import CacheStore
from shardkit.errors import CacheError, FetchError
from shardkit.io.verified import file_digest, timed_hasher

__all__ = ["Fetcher", "WriteError", "download", "download_run", "write_at"]

_MIN_SPLIT = 1 << 20  # a piece a reader waits for is fetched as ranges of at least this


class WriteError(CacheError):
    """The cache could not write a piece (a full disk): read on uncached, or raise."""


class Fetcher(Protocol):
    """What a download needs from its opener: the remote bytes and the cache they go to."""

    store: CacheStore

    def fetch(self, url: str, start: int, end: int, *, urgent: bool = False) -> Iterator[bytes]: ...


def download(
    host: Fetcher,
    url: str,
    fd: int,
    lo: int,
    hi: int,
    algo: str,
    *,
    split: int = 1,
    urgent: bool = False,
) -> str:
    """Write the remote bytes ``[lo, hi)`` of ``url`` at their offsets in ``fd``; their
    digest (or what came short). ``split``: over that many ranged requests at once;
    ``urgent``: a reader waits for them."""
    n = max(1, min(split, (hi - lo) // _MIN_SPLIT))
    if n > 1:
        return _download_split(host, url, fd, lo, hi, algo, n, urgent)
    h = timed_hasher(algo)
    pos = lo
    for chunk in host.fetch(url, lo, hi, urgent=urgent):
        _check_room(url, pos, len(chunk), lo, hi)
        write_at(fd, chunk, pos, host.store)
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest() if pos == hi else f"{pos - lo} of {hi - lo} bytes"


def download_run(
    host: Fetcher,
    url: str,
    fd: int,
    bounds: Sequence[int],
    algos: Sequence[str],
    piece_done: Callable[[int, str], bool],
    *,
    urgent: bool = False,
) -> tuple[int, str]:
    """Write the remote pieces ``[bounds[i], bounds[i + 1])`` of ``url`` at their offsets in
    ``fd`` over one ranged request, hashing each with ``algos[i]`` as its bytes arrive;
    ``piece_done(i, digest)`` is told each piece the moment it is whole and says whether to
    go on. Returns ``(i, what)``: the first piece not taken (``len(algos)``: all were) and
    its digest, or what came short of it."""
    chunks = host.fetch(url, bounds[0], bounds[-1], urgent=urgent)
    i, pos, h = 0, bounds[0], timed_hasher(algos[0])
    try:
        for chunk in chunks:
            _check_room(url, pos, len(chunk), bounds[0], bounds[-1])
            write_at(fd, chunk, pos, host.store)
            view = memoryview(chunk)
            while view:
                n = min(len(view), bounds[i + 1] - pos)
                h.update(view[:n])
                view, pos = view[n:], pos + n
                if pos == bounds[i + 1]:
                    if not piece_done(i, h.hexdigest()):
                        return i, h.hexdigest()
                    i += 1
                    if i < len(algos):
                        h = timed_hasher(algos[i])
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:  # a run given up early lets its connection go now
            close()
    if i == len(algos):
        return i, ""
    return i, f"{pos - bounds[i]} of {bounds[i + 1] - bounds[i]} bytes"


def _check_room(url: str, pos: int, n: int, lo: int, hi: int) -> None:
    """A chunk at ``pos`` must end inside ``[lo, hi)``, the bytes asked for: none of a
    longer answer is written (it could overwrite a piece verified already)."""
    if pos + n > hi:
        raise FetchError(
            f"the server sent more than the {hi - lo} bytes asked for at offset {lo}; "
            "none of the extra bytes is kept",
            url=url,
        )


def _download_split(
    host: Fetcher, url: str, fd: int, lo: int, hi: int, algo: str, n: int, urgent: bool
) -> str:
    """``[lo, hi)`` as ``n`` ranged requests at once; the digest of what was written."""
    bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
    got = [0] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            pos = bounds[i]
            for chunk in host.fetch(url, bounds[i], bounds[i + 1], urgent=urgent):
                _check_room(url, pos, len(chunk), bounds[i], bounds[i + 1])
                write_at(fd, chunk, pos, host.store)
                pos += len(chunk)
            got[i] = pos - bounds[i]
        except BaseException as exc:  # noqa: BLE001 - raised below, in the reader thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(1, n)]
    for t in threads:
        t.start()
    one(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if sum(got) != hi - lo:
        return f"{sum(got)} of {hi - lo} bytes"
    return file_digest(fd, hi, algo, start=lo)


def write_at(fd: int, data: bytes, pos: int, store: CacheStore) -> None:
    """Write all of ``data`` at ``pos`` of ``fd`` (a :class:`WriteError` naming the cache
    dir where the disk refuses)."""
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
    except OSError as exc:
        raise WriteError(
            f"cache dir {store.root}: cannot write ({exc.strerror}); the disk may be full"
        ) from exc
