"""A plain tar checked sample by sample, by the digests its sample index vouches for.

Where the manifest vouches for each sample's digest (a version 3 sample index checked by
its ``index_checksum``), :class:`SampleVerified` checks a plain tar sample by sample
instead of piece by piece (:mod:`shardkit.io.verified`): each read is hashed in place as it
passes (no piece buffer, no copy), and a sample is whole and checked once its last byte has
been read, which the tar reader does before it hands the sample out.
"""

from __future__ import annotations

import bisect
import io
import os
from collections import deque
from collections.abc import Sequence
from time import perf_counter
from typing import BinaryIO

from xxhash import xxh3_64

from shardkit.errors import ChecksumError
from shardkit.format.tario.index import sample_digest
from shardkit.io.verified import VERIFY_TIME

__all__ = ["SampleVerified"]

_CHUNK = 1 << 20  # a read of :meth:`SampleVerified.settle`
_KEEP_READS = 1 << 20  # bytes of recent reads kept for a step back (the reader's buffer is less)
_TELL_EVERY = 16 << 20  # bytes hashed between two additions to VERIFY_TIME
_SETTLE_MAX = 64 << 20  # the most of a sample read on to name its damage
_MARKER = 1024  # the end-of-archive marker: two zero blocks


class SampleVerified(io.RawIOBase):
    """The samples ``bounds[0]..bounds[-1]`` of a plain tar stream ``f``, each checked
    against its digest as its bytes pass (:mod:`shardkit.format.tario.index`: xxh3-64 of
    the sample's bytes, headers and padding included).

    Every read is hashed where it lies (the objects it returns are the ones hashed), in
    the order of the shard's bytes; a sample's digest is compared as soon as its last byte
    has been read, so a reader that hands a sample out only after reading past it (the
    tar reader reads the next header, or stops at the range's end) hands out checked
    bytes only: :attr:`verified_to` says how far they go. A sample that does not match is
    a :class:`ChecksumError` naming the shard, the sample and its offset, raised by the
    read that completed it (or by :meth:`settle`). Reads stop at ``stop``; the two blocks
    after ``bounds[-1]`` (the end-of-archive marker the reader parses on a whole read)
    must be zeros, so no member can come from bytes no digest covers; what follows them
    is read by no one as a member (tar readers stop at the marker), so it may be anything.

    The stream steps back (``seek``), as the tar reader does before it reads a large
    member into its own object, but only over what it read last (up to 1 MiB, none once
    the reader has read through :meth:`read_once`): the bytes read again must be the ones
    hashed the first time, else :class:`ChecksumError`.

    Args:
        f: a binary stream of the shard, positioned at ``bounds[0]``, that seeks to
            absolute offsets (a local file); closed with this stream.
        url: the shard's name, for errors.
        bounds: where each sample starts, then where the last one ends (offsets in the
            shard), ``first`` being the number of the first.
        digests: each sample's digest.
        stop: where reads stop (``bounds[-1]`` when None).
        size: the shard's size in the manifest: a file of another size is a
            :class:`ChecksumError` (closing ``f``).
        counts: the read's counters: each read adds the bytes it hands out (``"bytes"``;
            a seek what it steps over) and the seconds it took, the hash included
            (``"read_s"``), as a counting wrapper would, without another call a read.
    """

    def __init__(
        self,
        f: BinaryIO,
        *,
        url: str,
        bounds: Sequence[int],
        digests: Sequence[int],
        first: int = 0,
        stop: int | None = None,
        size: int | None = None,
        counts: dict[str, float] | None = None,
    ) -> None:
        if len(bounds) != len(digests) + 1:
            raise ValueError("bounds are the samples' starts and the last one's end")
        if size is not None:
            have = os.fstat(f.fileno()).st_size
            if have != size:
                f.close()
                raise ChecksumError(
                    "size differs from the manifest",
                    url=url,
                    expected=f"{size} bytes",
                    actual=f"{have} bytes",
                )
        self._f = f
        self.url = url
        self._bounds = bounds
        self._digests = digests
        self._first = first
        self._k = 0  # the sample being hashed
        # its bytes so far, when it spans reads: sample_digest's hash, fed in parts (the
        # C object itself: index.SampleDigester's calls cost ~1 us a sample; a test pins it)
        self._h: xxh3_64 | None = None
        self._pos = bounds[0]
        self._hashed = bounds[0]  # the first byte not hashed yet
        self.verified_to = bounds[0]
        self._stop = bounds[-1] if stop is None else stop
        # recent reads (start, end, bytes), for a step back
        self._kept: deque[tuple[int, int, bytes]] = deque()
        self._last = len(digests)
        self._verify_s = 0.0  # seconds spent hashing, not yet added to VERIFY_TIME
        self._told_at = bounds[0] + _TELL_EVERY
        self._counts: dict[str, float] = {} if counts is None else counts
        self._counts.setdefault("bytes", 0.0)
        self._counts.setdefault("read_s", 0.0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise OSError("a verified sample stream seeks from its start or where it is")
        target = offset + (self._pos if whence == io.SEEK_CUR else 0)
        lowest = self._kept[0][0] if self._kept else self._pos
        if not lowest <= target <= self._hashed:
            raise OSError(
                f"seek to {target}: a verified sample stream steps back over its last reads "
                f"only ({lowest}..{self._hashed})"
            )
        self._counts["bytes"] += abs(target - self._pos)
        self._pos = self._f.seek(target)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        data = self._take(size)
        if data:  # kept for a step back over it
            kept = self._kept
            stop = self._pos
            kept.append((stop - len(data), stop, data))
            while kept[0][1] <= stop - _KEEP_READS:
                kept.popleft()
        return data

    def read_once(self, n: int) -> bytes:
        """Read as :meth:`read` does, for a reader that will never step back over these
        bytes or any before them (the tar reader's read of a large member into its own
        object): nothing read so far is kept, these bytes neither (kept, they would hold
        memory the next reads would reuse warm)."""
        data = self._take(n)  # bytes read again after a step back checked first
        self._kept.clear()
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def _take(self, size: int | None) -> bytes:
        """Up to ``size`` bytes (all up to the stop when None or negative), hashed and
        counted; a sample they complete is checked."""
        pos = self._pos
        left = self._stop - pos
        n = left if size is None or size < 0 or size > left else size
        if n <= 0:
            return b""
        t0 = perf_counter()
        data = self._f.read(n)
        t1 = perf_counter()
        stop = pos + len(data)
        self._pos = stop
        hashed = self._hashed
        if pos < hashed:
            self._same(pos, data)
        if stop > hashed:
            k = self._k
            if k < self._last and stop < self._bounds[k + 1]:
                # inside one sample (a large member read into its own object): no check yet
                h = self._h
                if h is None:
                    h = self._h = xxh3_64()
                h.update(memoryview(data)[hashed - pos :] if hashed > pos else data)
                self._hashed = stop
            else:
                self._hash(data, hashed - pos, stop)
            if stop >= self._told_at:  # now and then: the shared counter takes a lock
                self._tell()
        t2 = perf_counter()
        self._verify_s += t2 - t1
        counts = self._counts
        counts["bytes"] += len(data)
        counts["read_s"] += t2 - t0
        return data

    def _hash(self, data: bytes, at: int, stop: int) -> None:
        """Hash ``data[at:]`` (the bytes from :attr:`_hashed` on, up to ``stop``, which
        completes a sample or goes past the last), checking each sample it completes; past
        the last sample the bytes must be zeros."""
        a = self._hashed
        k = self._k
        view = memoryview(data)
        bounds = self._bounds
        last = self._last
        while a < stop:
            if k == last:  # the end-of-archive marker the reader parses: zeros
                n = min(bounds[last] + _MARKER - a, len(data) - at)
                if n > 0 and data.count(0, at, at + n) != n:
                    raise self._not_zeros(bounds[last])
                break
            nxt = bounds[k + 1]
            b = nxt if nxt < stop else stop
            part = view[at : at + b - a]
            if b == nxt and self._h is None:  # the whole sample is in this read
                digest = sample_digest(part)
            else:
                h = self._h or xxh3_64()
                h.update(part)
                if b < nxt:
                    self._h = h
                    break
                digest, self._h = h.intdigest(), None
            if digest != self._digests[k]:
                raise self._error(k, digest)
            k += 1
            self.verified_to = nxt
            at += b - a
            a = b
        self._k = k
        self._hashed = stop

    def settle(self) -> None:
        """Read and check the rest of the sample being read: the error a damaged sample
        is, where the reader met its damage (a header that does not parse) before its end;
        nothing when it matches, or when more than 64 MiB of it are left (the reader's own
        error then stands: a legitimately refused member is not read to its end)."""
        if self._k >= self._last:
            return
        end = self._bounds[self._k + 1]
        if end - self._hashed > _SETTLE_MAX:
            return
        self.seek(self._hashed)
        while self._hashed < end:
            if not self.read(min(end - self._hashed, _CHUNK)):
                return  # the data ends early: the reader's truncation error stands

    def _error(self, k: int, actual: int) -> ChecksumError:
        lo, hi = self._bounds[k], self._bounds[k + 1]
        return ChecksumError(
            f"sample {self._first + k} (bytes {lo}..{hi}) differs from its digest in the "
            "sample index: the shard is damaged; not read",
            url=self.url,
            offset=lo,
            expected=f"xxh3_64:{self._digests[k]:016x}",
            actual=f"xxh3_64:{actual:016x}",
        )

    def _not_zeros(self, at: int) -> ChecksumError:
        return ChecksumError(
            "the two blocks after the last sample are not the end-of-archive marker's zeros: "
            "the shard is damaged; not read",
            url=self.url,
            offset=at,
        )

    def _same(self, pos: int, data: bytes) -> None:
        """Bytes read again after a step back must be the ones hashed the first time."""
        stop = min(pos + len(data), self._hashed)
        for at, end, old in self._kept:
            lo, hi = max(pos, at), min(stop, end)
            if lo < hi and data[lo - pos : hi - pos] != old[lo - at : hi - at]:
                k = bisect.bisect_right(self._bounds, lo) - 1
                raise ChecksumError(
                    f"bytes {lo}..{hi} (sample {self._first + k}) changed while they were "
                    "read: the shard is being rewritten; not read",
                    url=self.url,
                    offset=lo,
                )

    def _tell(self) -> None:
        VERIFY_TIME.add("verify_s", self._verify_s)
        self._verify_s = 0.0
        self._told_at = self._hashed + _TELL_EVERY

    def close(self) -> None:
        if not self.closed:
            self._kept.clear()
            self._tell()
            self._f.close()
        super().close()
