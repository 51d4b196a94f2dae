"""Random access: global sample ``i`` of a catalog, found and read by itself.

Sample ``i`` (in manifest order) lives in the shard whose cumulative count passes ``i``: a
binary search over the shard starts (in memory, no I/O), then the shard's sample index
gives the byte range of that one sample (two offsets and its signature). A
:class:`Lookups` (one per process) reads those bytes and parses the one sample from them
(:mod:`shardkit.read.sample_parse`):

- a local shard stays open (a bounded number per process, least recently used closed
  first). Where its sample index (version 3, vouched for by the manifest's
  ``index_checksum``) gives the sample's digest, the sample's bytes alone are read and
  hashed (xxh3-64: ~3 us for 150 KB, where its 1 MiB piece took ~1.1 ms of sha256).
  Otherwise, with a checksum in the manifest, the pieces holding the sample are read whole
  and checked first, as every local read is (:mod:`shardkit.io.local`), and kept in memory
  (a bounded number of bytes), so a later lookup in them reads and hashes nothing;
- a remote shard without a node cache: the pieces holding the sample are fetched whole
  and checked (:func:`~shardkit.io.remote.verified_open`, through
  :mod:`shardkit.read.piece_opener`), once, and kept the same way;
- a remote shard through the node cache: the cache fetches and verifies the pieces (once
  per node) and serves every later lookup in them from its file.

Remote bytes are checked against the sample's digest too, after the opener's piece check.
Bytes that differ are a :class:`ChecksumError` naming shard, sample and offset.
The sample found must carry the signature the index gives it, and the range must hold
exactly one sample: a wrong index is a :class:`ShardFormatError`, never another sample.
What the fast path cannot read (a compressed shard, one without a sample index, a
``pipe:`` url) is read through :func:`read_stream` as a sequential read is.
"""

from __future__ import annotations

import array
import bisect
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from shardkit._types import ObjectRef, Opener, Sample
from shardkit.errors import ChecksumError, FetchError, ShardFormatError
from shardkit.format.compression import compressed_name
from shardkit.format.tario.index import check_sample
from shardkit.io.config import ReaderLimits
from shardkit.io.local import computed_pieces
from shardkit.io.verified import PieceCheck
from shardkit.read.catalog import Catalog
from shardkit.read.piece_opener import PieceVerified
from shardkit.read.sample_parse import parse_sample
from shardkit.read.stream import read_stream
from shardkit.urls import local_path, url_scheme

__all__ = ["Locator", "Lookups", "read_sample"]

KEEP_OPEN = 16  # local shard files a process keeps open for lookups
# a sample spanning more is read as a stream: the index gives the range, and an index that
# is wrong (unchecked where the manifest gives no index checksum) must not make a lookup
# hold a whole shard in memory before the parse finds out
DIRECT_MAX = 64 << 20
KEEP_PIECE_BYTES = 2 << 20  # checked piece bytes a process keeps (one piece at least): more
# measured slower for random lookups (buffers cycled out of the CPU cache; hits are rare)


class Locator:
    """Global sample numbers to ``(shard, sample in shard)``, from the shards' counts."""

    def __init__(self, counts: np.ndarray) -> None:
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        # bisect over an array of C ints: ~0.4 us a lookup, numpy's searchsorted of one
        # Python int ~2-6 us (its conversions)
        self.starts = array.array("q", starts.tobytes())
        self.total = int(starts[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """The shard holding global sample ``i`` (``0 <= i < total``) and its place there."""
        if not 0 <= i < self.total:
            raise IndexError(f"sample {i} is out of range: the data set has {self.total}")
        shard = bisect.bisect_right(self.starts, i) - 1
        return shard, i - self.starts[shard]

    def start(self, shard: int) -> int:
        """The global number of a shard's first sample."""
        return self.starts[shard]


def read_sample(
    catalog: Catalog,
    opener: Opener,
    shard: int,
    j: int,
    counts: dict[str, float],
    *,
    limits: ReaderLimits | None = None,
) -> Sample:
    """Sample ``j`` of ``shard`` through a sequential read of its range: its signature
    checked (raises on bad data); ``limits``: the reader's (``max_member``, ``tar_policy``)."""
    row = iter([(shard, j, j + 1, 0)])
    for _, sample in read_stream(row, catalog, opener, counts, "raise", limits):
        return sample
    raise AssertionError("read_stream yields the sample or raises")  # pragma: no cover


class _LocalShard:
    """One local shard kept open for lookups; with ``verify`` (and a checksum in the
    manifest) its size is checked when it is opened, and :meth:`check` gives what its
    pieces must hash to, made when a lookup first needs it (None: read as it is)."""

    def __init__(self, ref: ObjectRef, verify: bool) -> None:
        self.url = ref.url
        self.ref = ref
        self.verify = verify and ref.verifiable
        self._check: PieceCheck | None = None
        try:
            self.fd = os.open(local_path(ref.url), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise FetchError(f"cannot open: {exc.strerror}", url=ref.url) from exc
        try:
            if self.verify:
                self._check_size()
        except BaseException:
            os.close(self.fd)
            raise

    def _check_size(self) -> None:
        have = os.fstat(self.fd).st_size
        if have != self.ref.size:
            raise ChecksumError(
                "size differs from the manifest",
                url=self.ref.url,
                expected=f"{self.ref.size} bytes",
                actual=f"{have} bytes",
            )

    def check(self) -> PieceCheck | None:
        """What the pieces must hash to (computed from the shard once where the manifest
        lists no pieces), or None where nothing is checked."""
        if not self.verify:
            return None
        if self._check is None:
            ref = self.ref
            assert ref.size is not None and ref.checksum is not None
            pieces = ref.pieces or computed_pieces(self.fd, ref.url, ref.size, ref.checksum)
            self._check = PieceCheck(ObjectRef(ref.url, ref.size, ref.checksum, pieces))
        return self._check

    def piece(self, k: int, spare: np.ndarray[Any, Any] | None) -> memoryview:
        """Piece ``k``, read whole (into ``spare`` if it is large enough) and checked
        (:class:`ChecksumError` if it differs)."""
        check = self.check()
        assert check is not None
        lo, hi = check.span(k)
        buf: Any = spare
        if buf is None or len(buf) < hi - lo:
            # a fresh buffer costs a page fault per 4 KiB, more than the read: see _room
            buf = np.empty(min(check.piece_size, check.size) or hi - lo, dtype=np.uint8)
        view = memoryview(buf)[: hi - lo]
        got = 0
        while got < hi - lo:
            n = os.preadv(self.fd, [view[got:]], lo + got)
            if not n:
                break
            got += n
        hasher = check.hasher(k)
        hasher.update(view[:got])
        actual = hasher.hexdigest()
        if got != hi - lo or actual != check.expected(k)[1]:
            short = f"{got} of {hi - lo} bytes"
            raise check.piece_error(k, actual if got == hi - lo else short, why="on disk")
        return view.toreadonly()

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` as they are on disk (no checksum to check them by)."""
        data = os.pread(self.fd, end - start, start)
        if len(data) != end - start:
            raise ShardFormatError(
                f"truncated: the file ends before byte {end}", url=self.url, offset=start
            )
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Lookups:
    """One process's reader of single samples (see the module docstring).

    Its threads' lookups take turns (a lock around the read, not the parse): the files and
    pieces kept, and the buffers pieces are read into, are the process's. Held in a
    :class:`~shardkit.per_process.PerProcess`: a forked child makes its own, so no file,
    piece or lock is shared across a fork.

    Args:
        catalog: the shards.
        opener: reads remote shards (verified) and the sample indexes.
        limits: the reader's limits (``max_member``, ``verify``, ``tar_policy``).
        keep_open: local shard files kept open at most.
        keep_bytes: bytes of checked pieces kept at most (one piece at least).
        direct_max: the largest sample read whole before it is parsed; a larger one is
            read as a stream (:func:`read_sample`).
    """

    def __init__(
        self,
        catalog: Catalog,
        opener: Opener,
        limits: ReaderLimits,
        *,
        keep_open: int = KEEP_OPEN,
        keep_bytes: int = KEEP_PIECE_BYTES,
        direct_max: int = DIRECT_MAX,
    ) -> None:
        self.catalog = catalog
        self.opener = opener
        self.limits = limits
        self.keep_open = max(1, keep_open)
        self.keep_bytes = keep_bytes
        self.direct_max = direct_max
        self._open: OrderedDict[str, _LocalShard] = OrderedDict()
        self._pieces: OrderedDict[tuple[str, str, int], memoryview] = OrderedDict()
        self._piece_bytes = 0
        self._lock = threading.RLock()  # reentrant, as every lock a close() may take
        self._finalizer = weakref.finalize(self, _close_all, self._open)

    def sample(self, shard: int, j: int, counts: dict[str, float]) -> Sample:
        """Sample ``j`` of ``shard``, checked (raises on bad data)."""
        with self._lock:
            info = self.catalog.shards[shard]
            url = info.ref.url
            scheme = url_scheme(url)
            if info.index_url is None or compressed_name(url) or scheme == "pipe":
                return read_sample(self.catalog, self.opener, shard, j, counts, limits=self.limits)
            start, end, signature, digest = self.catalog.sample_span(self.opener, shard, j)
            if end - start > self.direct_max:
                return read_sample(self.catalog, self.opener, shard, j, counts, limits=self.limits)
            if self.limits.verify != "on":
                digest = None
            try:
                if scheme == "file":
                    self.catalog.check_within(info, url)
                    data = self._local(info.ref, start, end, digest is not None)
                else:
                    data = self._remote(info.ref, start, end)
            except ChecksumError as exc:  # a piece's (or the size's): name the sample too
                raise _of_sample(exc, url, j, start, end) from exc
            if digest is not None:  # before a byte of it is used
                check_sample(data, digest, url=url, sample=j, offset=start)
            counts["bytes"] += len(data)
        # data is its own
        return parse_sample(data, info, start, end, signature, j, counts, limits=self.limits)

    # -- the bytes ---------------------------------------------------------------------
    def _local(self, ref: ObjectRef, start: int, end: int, own_digest: bool) -> bytes:
        """Bytes ``[start, end)`` of a local shard: as they are where the sample has a
        digest to check them by (``own_digest``), else from its checked pieces."""
        f = self._open.get(ref.url)
        if f is None:
            f = _LocalShard(ref, self.limits.verify == "on")
            self._open[ref.url] = f
            while len(self._open) > self.keep_open:
                self._open.popitem(last=False)[1].close()
        else:
            self._open.move_to_end(ref.url)
        check = None if own_digest else f.check()
        if check is None:
            return f.read(start, end)
        return self._from_pieces(ref, check, start, end, f.piece)

    def _remote(self, ref: ObjectRef, start: int, end: int) -> bytes:
        if not isinstance(self.opener, PieceVerified) or ref.pieces is None:
            with self.opener.open(ref, start, end) as f:  # the node cache, or no check
                return _read_exactly(f, end - start, ref.url, start)
        check = PieceCheck(ref)  # pieces are fetched whole and checked by the opener

        def fetch(k: int, spare: np.ndarray[Any, Any] | None) -> memoryview:
            del spare  # the stream hands out bytes of its own
            lo, hi = check.span(k)
            with self.opener.open(ref, lo, hi) as f:
                return memoryview(_read_exactly(f, hi - lo, ref.url, lo))

        return self._from_pieces(ref, check, start, end, fetch)

    def _from_pieces(
        self, ref: ObjectRef, check: PieceCheck, start: int, end: int, load: Any
    ) -> bytes:
        """``[start, end)`` from the checked pieces holding it (kept, or ``load(k)``)."""
        parts: list[memoryview] = []
        for k in range(check.piece_of(start), check.piece_of(end - 1) + 1):
            lo, _ = check.span(k)
            key = (ref.url, check.checksum, k)
            piece = self._pieces.get(key)
            if piece is None:
                piece = load(k, self._room(min(check.piece_size, check.size), len(parts)))
                self._pieces[key] = piece
                self._piece_bytes += len(piece)
            else:
                self._pieces.move_to_end(key)
            parts.append(piece[max(start, lo) - lo : end - lo])
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def _room(self, size: int, busy: int) -> np.ndarray[Any, Any] | None:
        """Drop the oldest pieces until one more of ``size`` bytes fits, but not the
        ``busy`` newest (the lookup's own); the buffer of the last one dropped, for the next
        piece to be read into (a buffer used again has its pages mapped already: a fresh
        one measured slower to fill than the read itself)."""
        spare = None
        while len(self._pieces) > busy and self._piece_bytes + size > self.keep_bytes:
            piece = self._pieces.popitem(last=False)[1]
            self._piece_bytes -= len(piece)
            spare = piece.obj if isinstance(piece.obj, np.ndarray) else None
        return spare

    def close(self) -> None:
        """Close the files kept open and drop the pieces kept (it can be used again)."""
        with self._lock:
            _close_all(self._open)
            self._pieces.clear()
            self._piece_bytes = 0

    def stats(self) -> dict[str, int]:
        """Files kept open and bytes of checked pieces kept now."""
        return {"open_shards": len(self._open), "piece_bytes": self._piece_bytes}


def _of_sample(exc: ChecksumError, url: str, j: int, start: int, end: int) -> ChecksumError:
    """``exc`` (of a piece or the whole shard) said of the lookup of sample ``j``."""
    detail = str(exc).removeprefix(f"{url}: ")
    new = ChecksumError(
        f"sample {j} (bytes {start}..{end}) not read: {detail}", url=url, offset=start
    )
    new.expected, new.actual = exc.expected, exc.actual
    return new


def _close_all(files: OrderedDict[str, _LocalShard]) -> None:
    while files:
        files.popitem()[1].close()


def _read_exactly(f: BinaryIO, n: int, url: str, at: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ShardFormatError(f"truncated: {len(data)} of {n} bytes", url=url, offset=at)
    return data
