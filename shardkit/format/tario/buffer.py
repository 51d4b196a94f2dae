"""The buffered byte layer under the tar reader: large reads, slices, unbuffered reads, skips.

Headers are parsed straight out of large buffered reads; small members are sliced out of
the same buffer; a large member of a plain file is read straight into its own ``bytes`` (no
copy but the kernel's), and on a stream of unknown size in bounded pieces. Memory stays
bounded by the data actually present, whatever a header claims. Bytes that are passed over
are still read (so a hashing stream below sees them): :func:`skip_bytes` is the one way.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from shardkit.errors import ShardFormatError, ShardkitError
from shardkit.format.tario.headers import BLOCK

__all__ = ["DEFAULT_MAX_MEMBER", "Buffered", "skip_bytes", "stream_size"]

# buffered read size, and the largest read of a stream of unknown size; 512 KiB measured
# ~25% faster than 1 MiB on shards with a pax header per member, the same on others
_CHUNK = 1 << 19
_PIECE = 64 << 20  # large members are read in pieces of this size
# a member at least this large whose data is not all in the buffer is read straight into
# its own bytes object (one copy, the kernel's), when the stream can seek and has a size
_UNBUFFERED = 1 << 16
_SHORT_GAP = 1 << 16  # the longest run between two members read unbuffered read as one
_AFTER_UNBUFFERED = 8 << 10  # the buffered read after one, when that run was longer
_DISCARD = 8 << 20  # the largest read when passing over data that is not kept
DEFAULT_MAX_MEMBER = 1 << 30  # the largest member a reader holds in memory, by default


class Buffered:
    """A binary stream read through one large buffer, with absolute offsets for errors.

    Args (see :class:`~shardkit.format.tario.reader.TarReader`): the stream ``f``
    positioned at ``start``, the shard's ``url``, the range ``span`` (``start, end``), the
    stream's ``size`` (found with ``fstat`` when None), and ``keep``: the largest member
    whose data is kept (``max_member``), or None to keep none (``keep_data`` off).
    """

    def __init__(
        self,
        f: BinaryIO,
        url: str,
        span: tuple[int, int | None],
        size: int | None,
        keep: int | None,
    ) -> None:
        start, end = span
        self.f = f
        self.url = url
        self.keep_data = keep is not None
        self.max_member = DEFAULT_MAX_MEMBER if keep is None else keep
        self.end = end
        self.size = size if size is not None else stream_size(f)
        self.buf = b""
        self.pos = 0
        self.base = start  # absolute offset of _buf[0]
        self._chunk = _CHUNK  # the next buffered read's size (smaller after an unbuffered read)
        self._seeks: bool | None = None  # whether unbuffered reads work here (found on first use)
        self._unbuffered_end = -1  # where the last member read unbuffered ended
        self.member_offset = start  # where the last member (with its pax headers) began
        self.end_offset: int | None = None  # the end-of-archive marker (or ``end``), once met
        # a member read into its own object is read through ``read_once`` where the
        # stream has one: nothing up to its end is read again (a stream that keeps its
        # last reads to check a step back keeps no member: io.verified_samples.SampleVerified)
        self._read_once: Callable[[int], bytes] = getattr(f, "read_once", f.read)

    @property
    def offset(self) -> int:
        """The absolute offset of the next unread byte."""
        return self.base + self.pos

    def _read(self, n: int, at: int, *, once: bool = False) -> bytes:
        """Up to ``n`` bytes; ``once``: none of them, nor any before, is read again."""
        if self.size is None:
            n = min(n, _CHUNK)  # never trust a claim to size a read
        try:
            return self._read_once(n) if once else self.f.read(n)
        except ShardFormatError as exc:  # a decoding stream below (zstd) found bad data
            raise ShardFormatError(str(exc), url=self.url, offset=at) from exc
        except ShardkitError:
            raise  # a FetchError or CacheError from the io below keeps its own type
        except OSError as exc:
            raise ShardFormatError(f"read failed: {exc}", url=self.url, offset=at) from exc

    def fill(self, need: int) -> bool:
        """Make ``need`` bytes available at _pos; False when the stream ends first."""
        avail = len(self.buf) - self.pos
        if avail >= need:
            return True
        parts = [self.buf[self.pos :]] if avail else []
        self.base += self.pos
        self.pos = 0
        chunk, self._chunk = self._chunk, min(self._chunk * 2, _CHUNK)
        while avail < need:
            data = self._read(max(need, chunk) - avail, self.base + avail)
            if not data:
                break
            parts.append(data)
            avail += len(data)
        self.buf = b"".join(parts) if len(parts) != 1 else parts[0]
        return avail >= need

    def finish(self) -> None:
        """After the end-of-archive marker of a whole read: a decompressing stream is read
        on to its end, so that its integrity check runs (gzip's CRC-32 and length, zstd's
        content checksum, and that the compressed stream is whole), as GNU tar's
        decompressor does. What follows the marker is passed over, as in a plain tar
        (which is not read past it); errors name the offset in the tar where it began."""
        if not getattr(self.f, "checked_at_end", False):
            return
        at = self.offset
        self.base += len(self.buf)
        self.buf, self.pos = b"", 0
        while data := self._read(_DISCARD, at):
            self.base += len(data)

    def truncated(self, what: str, n: int, at: int) -> ShardFormatError:
        return ShardFormatError(
            f"truncated: {what} needs {n} bytes, the data ends at byte {self.base + len(self.buf)}",
            url=self.url,
            offset=at,
        )

    def take(self, n: int, what: str, at: int) -> bytes:
        """Return the next ``n`` bytes; raise naming header offset ``at`` if they run out."""
        if n <= _PIECE:
            if n >= _UNBUFFERED and len(self.buf) - self.pos < n and self._can_seek():
                return self._take_unbuffered(n, what, at)
            if not self.fill(n):
                raise self.truncated(what, n, at)
            p = self.pos
            self.pos = p + n
            return self.buf[p : p + n]
        return self._take_large(n, what, at)

    def _can_seek(self) -> bool:
        if self._seeks is None:
            seekable = getattr(self.f, "seekable", None)
            self._seeks = self.size is not None and seekable is not None and bool(seekable())
        return self._seeks

    def _take_unbuffered(self, n: int, what: str | None, at: int, name: str = "") -> bytes:
        """``n`` bytes read into their own object: the kernel copies them once, where
        joining the buffer with the rest would copy them twice more.

        The stream steps back over what the buffer holds of them. So that it rarely has
        to, the buffered read that follows is short: as long as the run from the end of
        the last member read unbuffered to the start of this one, when that is short
        (samples tend to repeat their layout, so it ends where the next large member
        begins), else 8 KiB.
        """
        avail = len(self.buf) - self.pos
        try:
            if avail:
                self.f.seek(-avail, io.SEEK_CUR)
        except OSError as exc:
            raise ShardFormatError(f"seek failed: {exc}", url=self.url, offset=at) from exc
        self.base += self.pos
        gap = self.base - self._unbuffered_end
        self.buf, self.pos = b"", 0
        data = self._read(n, self.base, once=True)
        self.base += len(data)
        while len(data) < n:  # a short read: rare for a file (a signal), or its end
            more = self._read(n - len(data), self.base, once=True)
            if not more:
                raise self.truncated(what or f"member {name!r}", n, at)
            self.base += len(more)
            data += more
        self._unbuffered_end = self.base
        self._chunk = gap if BLOCK <= gap <= _SHORT_GAP else _AFTER_UNBUFFERED
        return data

    def _take_large(self, n: int, what: str, at: int) -> bytes:
        """``n`` bytes read in bounded pieces into one growing buffer: no joined copy.

        BytesIO grows its bytes object in place (realloc) and ``getvalue()`` hands that
        same object out, so the peak is the member plus one piece, not twice the member.
        """
        out = io.BytesIO()
        avail = len(self.buf) - self.pos
        if avail:
            out.write(memoryview(self.buf)[self.pos :])
        self.base += len(self.buf)
        self.buf, self.pos = b"", 0
        left = n - avail
        while left > 0:
            data = self._read(min(left, _PIECE), self.base)
            if not data:
                raise self.truncated(what, n, at)
            out.write(data)
            self.base += len(data)
            left -= len(data)
        return out.getvalue()

    def check_claim(self, size: int, at: int, name: str) -> None:
        if self.size is not None and self.offset + size > self.size:
            raise ShardFormatError(
                f"member {name!r} claims {size} bytes, past the end of the data "
                f"({self.size} bytes): truncated or corrupt",
                url=self.url,
                offset=at,
            )

    def _discard(self, n: int, what: str, at: int) -> None:
        """Pass over ``n`` bytes without keeping them (each is still read, so hashed)."""
        avail = len(self.buf) - self.pos
        if n <= avail:
            self.pos += n
            return
        left = n - avail
        self.base += len(self.buf)
        self.buf, self.pos = b"", 0

        def read(k: int) -> bytes:
            data = self._read(k, self.base)
            self.base += len(data)
            return data

        if _drop(read, left) < left:
            raise self.truncated(what, n, at)

    def member_data(self, size: int, at: int, name: str, *, keep: bool = True) -> bytes:
        """A member's ``size`` data bytes and its padding, checked against the data's size
        and (when kept) ``max_member``; errors name the member's header at ``at``."""
        if (
            keep
            and _UNBUFFERED <= size <= self.max_member
            and size <= _PIECE
            and self.size is not None
            and self.base + self.pos + size <= self.size
            and len(self.buf) - self.pos < size
            and self._can_seek()
        ):  # the common large member, as take() reads it, in fewer steps (and no message
            # made for an error that does not come)
            data = self._take_unbuffered(size, None, at, name)
        elif not keep:
            self.check_claim(size, at, name)
            self._discard(size + (-size) % BLOCK, f"member {name!r}", at)
            return b""
        else:
            data = self._checked_data(size, at, name)
        pad = (-size) % BLOCK
        if pad:
            if not self.fill(pad):
                raise self.truncated(f"the padding of member {name!r}", pad, at)
            self.pos += pad
        return data

    def _checked_data(self, size: int, at: int, name: str) -> bytes:
        """:meth:`member_data`'s kept data on every other path: checked against the data's
        size and ``max_member``, then read."""
        self.check_claim(size, at, name)
        what = f"member {name!r}"
        if size > self.max_member:
            raise ShardFormatError(
                f"{what} is {size} bytes, over the largest-member limit of {self.max_member} "
                "bytes (if this shard is trusted, raise it: "
                "io=IoConfig(limits=ReaderLimits(max_member=...)), read_shard(max_member=...) "
                "or --max-member)",
                url=self.url,
                offset=at,
            )
        return self.take(size, what, at)


def _drop(read: Callable[[int], bytes], n: int) -> int:
    """Read and drop ``n`` bytes through ``read``; the count dropped (less at the end)."""
    left = n
    while left > 0:
        got = read(min(left, _DISCARD))
        if not got:
            break
        left -= len(got)
    return n - left


def skip_bytes(f: BinaryIO, n: int) -> int:
    """Read and drop ``n`` bytes of a stream that cannot seek (a decompressor); the count
    dropped, less than ``n`` only where the stream ends first."""
    return _drop(f.read, n)


def stream_size(f: BinaryIO) -> int | None:
    """The size of the plain file behind ``f``, or None (pipes, sockets, decoders)."""
    try:
        st = os.fstat(f.fileno())
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
