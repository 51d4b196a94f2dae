"""Filling one shard into the cache piece by piece, shared by every process that wants it.

A fill writes into the shard's temp file (see :class:`~shardkit.cache.layout.FillPieces`): the
bytes of piece *k* at their offsets, then byte *k* of the piece map set to 1 once the piece
matched its checksum. The map is the only state, on disk, in the file it speaks of:

- a piece is fetched by whoever claims it first (an open file description lock on its map
  byte, :func:`~shardkit.cache.locks.claim_byte`): a reader claims the piece it needs
  *now*, and background threads (``piece_parallel`` per shard and process, each request
  under the node's request cap) claim the next ones after it, then the ones before, so a
  worker starting mid-shard gets its own pieces at once and the shard fills over several
  ranged requests in parallel;
- a reader waits only for the piece it needs, and at most ``cache_wait`` seconds while
  another thread or process holds it: it blocks on the holder's claim
  (:func:`~shardkit.cache.locks.wait_claim`) and wakes the moment the claim goes, the
  piece verified or its holder dead (a claim dies with its process: a SIGKILLed fill's
  piece is taken over by the next one that wants it, its verified pieces are kept);
- a piece that does not match is fetched once more; twice is a :class:`ChecksumError`
  naming the shard and the piece, and no byte of it ever reaches a reader;
- whoever finds every piece verified checks the whole shard against the manifest's
  checksum, cuts the map off and publishes it (one process: the key's publish lock;
  :class:`~shardkit.cache.verdict.ShardVerdict`).

A manifest without pieces gives one piece, the whole shard, checked by its checksum: a
reader then gets its first byte once the whole shard is verified.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from shardkit._types import ObjectRef
from shardkit.activity import waiting
from shardkit.cache.download import Fetcher, WriteError, download, download_run, write_at
from shardkit.cache.layout import CacheKey, FillPieces
from shardkit.cache.locks import claim_byte, unlock, wait_claim
from shardkit.cache.verdict import ShardVerdict, VerdictHost
from shardkit.errors import CacheError, ChecksumError, FetchError
from shardkit.io.verified import PieceCheck

__all__ = ["FillHost", "ShardFill"]

log = logging.getLogger(__name__)


class FillHost(Fetcher, VerdictHost, Protocol):
    """What a fill needs from its opener: its fetch and store, counters and options."""


class ShardFill:
    """This process's part in filling one shard (see the module docstring).

    ``fd`` is the fill's own lease on the temp file; it is closed when the fill is over.
    ``done`` is set once the shard is published, given up, or left to another process.
    """

    def __init__(self, host: FillHost, ref: ObjectRef, fd: int) -> None:
        self.host = host
        self.ref = ref
        self.check = PieceCheck(ref)  # what every piece and the whole must hash to
        self.key = CacheKey.of(self.check.checksum, self.check.size)
        self.url = ref.url
        self.layout = FillPieces.of(self.check.size, ref.pieces)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._fd: int | None = fd
        self._lock = threading.RLock()  # reentrant, as every lock a close() may take
        self._cursor = 0
        self._threads = 0
        self._ending = False  # its last thread is out: no thread starts again
        self._failed: dict[int, ChecksumError] = {}
        self.verdict = ShardVerdict(
            host, self.check, self.key, self.layout, close=self._close, held_off=self._held_off
        )

    # -- the map -------------------------------------------------------------------
    def ready(self, fd: int, k: int) -> bool:
        """Whether piece ``k`` of the file ``fd`` is verified (a cut map: all are)."""
        return os.pread(fd, 1, self.key.size + k) != b"\0"

    def need(self, fd: int, k: int) -> None:
        """Return once piece ``k`` of the file ``fd`` is verified: fetched here if nobody
        is at it, else waited for (at most ``cache_wait`` seconds). Once every piece is,
        also the whole shard: a :class:`ChecksumError` if it does not match its checksum
        (whichever thread or process found that out)."""
        if not self.ready(fd, k):
            self._wait_for(fd, k)
        if b"\0" not in os.pread(fd, self.layout.count, self.key.size):
            # the last piece (fetched here or not): its threads, started if none ran, end
            # now and let the fill's lease go, so the next reservation can evict the shard
            # as soon as its readers are done; the whole is checked by one of them, or here
            self.start(k)
            self.done.wait(self.host.cfg.cache.cache_wait)  # its own threads decide, lease closed
            self.verdict.judge(fd)

    def _wait_for(self, fd: int, k: int) -> None:
        if k in self._failed:  # corrupt twice in this fill: not fetched a third time
            raise self._failed[k]
        t0 = time.monotonic()
        wait = self.host.cfg.cache.cache_wait
        after = functools.partial(self.start, k + 1)  # the next pieces, once this one is ours
        split = self.host.cfg.cache.piece_parallel
        while not self._fetch(fd, k, split=split, urgent=True, claimed=after):
            after()
            left = wait - (time.monotonic() - t0)
            if left <= 0 or not self._held_off(fd, self.key.size + k, left, f"piece {k}"):
                raise CacheError(
                    f"{self.url}: waited {time.monotonic() - t0:.0f} s for piece {k} of "
                    f"another fill (cache_wait={wait:g})"
                )

    def _held_off(self, fd: int, byte: int, timeout: float, what: str) -> bool:
        """Wait for another process's claim on ``byte`` (:func:`wait_claim`), named as
        this thread's wait (:mod:`shardkit.activity`: a stall report finds its pid)."""
        path = os.readlink(f"/proc/self/fd/{fd}")
        with waiting("cache fill", url=self.url, of=what, file=path, byte=byte):
            return wait_claim(fd, byte, timeout)

    # -- fetching a piece ----------------------------------------------------------
    def _fetch(
        self,
        fd: int,
        k: int,
        *,
        split: int = 1,
        urgent: bool = False,
        claimed: Callable[[], None] | None = None,
    ) -> bool:
        """Fetch, verify and mark piece ``k`` unless another claim holds it; True if it
        is verified now. ``split``: over that many ranged requests at once; ``urgent``: a
        reader waits for it (its requests may take the slots kept for readers)."""
        if self.ready(fd, k):
            return True
        if k in self._failed:
            raise self._failed[k]
        claim = claim_byte(fd, self.key.size + k)
        if claim is None:
            return False
        run = [(k, claim)]  # the pieces claimed here, each let go once done with
        try:
            if claimed is not None:
                claimed()
            if self.ready(claim, k):
                return True
            if k in self._failed:  # corrupt twice while another thread held the claim
                raise self._failed[k]
            if split == 1 and not urgent:  # a background fetch: a run of pieces, one request
                run += self._claim_run(claim, k)
            return self._download(run, split=split, urgent=urgent)
        finally:
            for _, fd_k in run:
                if fd_k >= 0:  # (-1: let go already)
                    unlock(fd_k)

    def _claim_run(self, fd: int, k: int) -> list[tuple[int, int]]:
        """Claims on the pieces after ``k`` that nobody holds nor has verified, as many in a
        row as fit one ranged request: at most ``range_size`` bytes, and a share of the shard
        small enough that ``piece_parallel`` runs fill it side by side."""
        width = self.host.cfg.cache.piece_parallel
        room = min(self.host.cfg.range_size, -(-self.check.size // width))
        lo, hi = self.check.span(k)
        run: list[tuple[int, int]] = []
        for j in range(k + 1, self.layout.count):
            hi = self.check.span(j)[1]
            if hi - lo > room or j in self._failed or self.ready(fd, j):
                break
            claim = claim_byte(fd, self.key.size + j)
            if claim is None:
                break
            if self.ready(claim, j):
                unlock(claim)
                break
            run.append((j, claim))
        return run

    def _download(self, run: list[tuple[int, int]], *, split: int, urgent: bool) -> bool:
        """Fetch the claimed pieces of ``run`` (in a row) in one ranged request, each marked
        and its claim let go the moment it matches; one that does not (or came short) is
        fetched once more alone, and the claims after it let go. True: the first is done."""
        k, claim = run[0]
        lo, hi = self.check.span(k)
        if len(run) == 1:  # as many requests at once as ``split`` asks
            got = download(
                self.host,
                self.url,
                claim,
                lo,
                hi,
                self.check.expected(k)[0],
                split=split,
                urgent=urgent,
            )
            i, actual = (1, "") if self._took(run, 0, got) else (0, got)
        else:  # written through a description of its own: each claim goes once checked
            wfd = os.open(f"/proc/self/fd/{claim}", os.O_RDWR | os.O_CLOEXEC)
            try:
                bounds = [lo] + [self.check.span(j)[1] for j, _ in run]
                algos = [self.check.expected(j)[0] for j, _ in run]
                took = functools.partial(self._took, run, wfd=wfd)
                i, actual = download_run(
                    self.host, self.url, wfd, bounds, algos, took, urgent=urgent
                )
            finally:
                os.close(wfd)
        if i == len(run):
            return True
        k, claim = run[i]
        for _, later in run[i + 1 :]:  # not fetched here: whoever wants them next
            unlock(later)
        del run[i + 1 :]
        self._mismatch(k, actual, 1)
        lo, hi = self.check.span(k)
        algo, want = self.check.expected(k)
        actual = download(self.host, self.url, claim, lo, hi, algo, split=split, urgent=urgent)
        if actual == want:
            self._mark(k, claim)
            return True
        self._mismatch(k, actual, 2)
        self._failed[k] = self.check.piece_error(k, actual)
        self._stop(self._failed[k])  # this fill is over; a later open tries again
        raise self._failed[k]

    def _took(
        self, run: list[tuple[int, int]], i: int, actual: str, *, wfd: int | None = None
    ) -> bool:
        """Piece ``i`` of ``run`` arrived whole as ``actual``: marked if it matches, and its
        claim let go at once (readers waiting on it wake now) where ``wfd`` writes the run;
        False if it does not match."""
        k, claim = run[i]
        if actual != self.check.expected(k)[1]:
            return False
        self._mark(k, claim)
        if wfd is not None:
            run[i] = (k, -1)
            unlock(claim)
        return True

    def _mark(self, k: int, claim: int) -> None:
        write_at(claim, b"\1", self.key.size + k, self.host.store)
        self.host.counters.add("pieces_fetched")

    def _mismatch(self, k: int, actual: str, attempt: int) -> None:
        lo, hi = self.check.span(k)
        self.host.counters.add("checksum_failures")
        log.warning(
            "%s: piece %d (bytes %d..%d) differs from the manifest (%s), attempt %d of 2",
            self.url,
            k,
            lo,
            hi,
            actual,
            attempt,
        )

    # -- the background ------------------------------------------------------------
    def start(self, k: int = 0) -> None:
        """Fill the pieces from ``k`` on (then the ones before) in the background."""
        count = self.layout.count
        with self._lock:
            self._cursor = k % count
            if self.done.is_set() or self._fd is None or self._ending:
                return  # (ending: its last thread publishes and closes the file now)
            while self._threads < min(self.host.cfg.cache.piece_parallel, count):
                self._threads += 1
                name = f"shardkit-fill-{self.key.digest[:12]}-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()

    def _next(self, fd: int) -> list[int]:
        """The pieces not verified yet, from the cursor on."""
        count = self.layout.count
        with self._lock:
            first = self._cursor
        seen = os.pread(fd, count, self.key.size)  # one read of the whole map
        order = [(first + i) % count for i in range(count)]
        return [k for k in order if k < len(seen) and not seen[k]]

    def _work(self) -> None:
        """One background thread: fetch pieces until every one is verified; the last
        thread out publishes (no other thread of the fill uses its file by then)."""
        # piece_parallel requests per shard in all: a shard of fewer pieces than that (the
        # last, small shard of a set) splits them, else it would crawl over one connection
        width = self.host.cfg.cache.piece_parallel
        split = max(1, width // min(width, self.layout.count))
        try:
            fd = self._fd
            while fd is not None and not self.done.is_set():
                todo = self._next(fd)
                if not todo:
                    break
                for k in todo:
                    with self._lock:
                        self._cursor = (k + 1) % self.layout.count
                    if self._fetch(fd, k, split=split):
                        break
                else:  # others fetch the rest: wait for them, or their death
                    wait_claim(fd, self.key.size + todo[0], self.host.cfg.cache.cache_wait)
        except (FetchError, ChecksumError, CacheError) as exc:
            log.warning("%s: the cache fill stops: %s", self.url, exc)
            self._stop(exc)
        except OSError as exc:  # the cache dir: read-only, full, gone; readers go on
            self._stop(self._cache_error(exc))
        except BaseException as exc:  # a bug: let the readers see it rather than hang
            self._stop(exc)
            raise
        finally:
            with self._lock:
                self._threads -= 1
                last = self._ending = self._threads == 0
            if last:
                self._last_out()

    def _last_out(self) -> None:
        try:
            if not self.done.is_set():
                self._finish()
        except CacheError as exc:
            log.warning("%s: not cached: %s", self.url, exc)
            self._stop(exc)
        except OSError as exc:
            self._stop(self._cache_error(exc))
        finally:
            self._close()
            self.done.set()

    def _cache_error(self, exc: OSError) -> WriteError:
        """An OS error on the cache dir in a fill thread: a warning and a count, never a
        thread's traceback; its readers read on uncached."""
        self.host.counters.add("cache_errors")
        error = WriteError(f"cache dir {self.host.store.root}: {exc}")
        log.warning("%s: the cache fill stops: %s (reading on uncached)", self.url, error)
        return error

    def _stop(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()

    def _close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:  # a temp file given up meanwhile is removed once let go
            self.host.store.let_go(fd, self.key, self.layout)

    def _finish(self) -> None:
        """Every piece is verified: check the whole and publish it (one process does)."""
        fd = self._fd
        assert fd is not None
        if b"\0" in os.pread(fd, self.layout.count, self.key.size):
            return  # not every piece: nothing to decide
        bad = self.verdict.finish(fd)
        if bad is not None:
            self.error = bad
