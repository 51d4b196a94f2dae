"""The member layer of the tar reader: buffered reads, header parsing, hostile-input checks.

Headers are parsed straight out of large buffered reads; small members are sliced out of
the same buffer; a large member of a plain file is read straight into its own ``bytes`` (no
copy but the kernel's), and on a stream of unknown size in bounded pieces. Hostile members
(absolute or ``..`` paths, links, devices, sizes past the end of the data, bad header
checksums) raise :class:`ShardFormatError` naming the shard and the byte offset. Memory
stays bounded by the data actually present, whatever a header claims. :class:`MemberReader`
is the general (slow) path that names every error; :mod:`shardkit.format.tario.reader` builds the
sample loop and its fast path on it.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from shardkit.errors import ShardFormatError, ShardkitError
from shardkit.format.tario.headers import parse_number, parse_pax, ustar_name
from shardkit.format.tario.names import name_problem

__all__ = ["BLOCK", "DEFAULT_MAX_MEMBER", "MemberReader", "stream_size"]

BLOCK = 512
_ZERO = b"\0" * BLOCK
# buffered read size, and the largest read of a stream of unknown size; 512 KiB measured
# ~25% faster than 1 MiB on shards with a pax header per member, the same on others
_CHUNK = 1 << 19
_PIECE = 64 << 20  # large members are read in pieces of this size
# a member at least this large whose data is not all in the buffer is read straight into
# its own bytes object (one copy, the kernel's), when the stream can seek and has a size
_DIRECT = 1 << 16
_SHORT_GAP = 1 << 16  # the longest run between two directly read members read as one
_AFTER_DIRECT = 8 << 10  # the buffered read after one, when that run was longer
_DISCARD = 8 << 20  # the largest read when passing over data that is not kept
_MAX_META = 1 << 20  # pax / GNU long-name records larger than this are hostile
DEFAULT_MAX_MEMBER = 1 << 30  # the largest member a reader holds in memory, by default
_REGULAR = (b"0", b"\0", b"7")
_REJECT = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
}

Sample = dict[str, object]


class MemberReader:
    """Iterate the regular members of a tar stream (the general path; see TarReader).

    Args:
        f: a binary stream positioned at ``start`` (a member header).
        url: the shard's name, used in error messages.
        start: the absolute byte offset ``f`` is positioned at.
        end: stop before this absolute offset (a sample-range read); None reads to the
            end-of-archive marker, which must be present.
        size: the stream's total size when known (found with ``fstat`` for plain files);
            a member claiming bytes past it is rejected before anything is read. When
            the size is unknown, reads are bounded pieces, so a false claim costs memory
            only for the bytes really there.
        keep_data: False reads past member data without keeping it (fields come back
            as their size in bytes, an ``int``): a check of the structure, or a count of
            field sizes, that still reads every byte and holds none of it.
        max_member: the largest member (bytes) whose data is kept in memory; a larger
            one is a :class:`ShardFormatError` raised before any of its data is read
            (a 65 KB zstd bomb can claim gigabytes). Not applied when ``keep_data`` is off.

    Errors name the header block at fault: :attr:`ShardFormatError.offset` is the start
    of the (extended) header of the bad or truncated member, of a partial header, or
    where an end-of-archive marker was expected.
    """

    def __init__(
        self,
        f: BinaryIO,
        *,
        url: str = "<stream>",
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
        keep_data: bool = True,
        max_member: int = DEFAULT_MAX_MEMBER,
    ) -> None:
        self.f = f
        self.url = url
        self.keep_data = keep_data
        self.max_member = max_member
        self.end = end
        self.size = size if size is not None else stream_size(f)
        self._buf = b""
        self._pos = 0
        self._base = start  # absolute offset of _buf[0]
        self._chunk = _CHUNK  # the next buffered read's size (smaller after a direct read)
        self._direct: bool | None = None  # whether direct reads work here (found on first use)
        self._direct_end = -1  # where the last directly read member ended
        self.member_offset = start  # where the last member (with its pax headers) began
        self.end_offset: int | None = None  # the end-of-archive marker (or ``end``), once met

    @property
    def offset(self) -> int:
        """The absolute offset of the next unread byte."""
        return self._base + self._pos

    def _read(self, n: int, at: int) -> bytes:
        if self.size is None:
            n = min(n, _CHUNK)  # never trust a claim to size a read
        try:
            return self.f.read(n)
        except ShardFormatError as exc:  # a decoding stream below (zstd) found bad data
            raise ShardFormatError(str(exc), url=self.url, offset=at) from exc
        except ShardkitError:
            raise  # a FetchError or CacheError from the io below keeps its own type
        except OSError as exc:
            raise ShardFormatError(f"read failed: {exc}", url=self.url, offset=at) from exc

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at _pos; False when the stream ends first."""
        avail = len(self._buf) - self._pos
        if avail >= need:
            return True
        parts = [self._buf[self._pos :]] if avail else []
        self._base += self._pos
        self._pos = 0
        chunk, self._chunk = self._chunk, min(self._chunk * 2, _CHUNK)
        while avail < need:
            data = self._read(max(need, chunk) - avail, self._base + avail)
            if not data:
                break
            parts.append(data)
            avail += len(data)
        self._buf = b"".join(parts) if len(parts) != 1 else parts[0]
        return avail >= need

    def _truncated(self, what: str, n: int, at: int) -> ShardFormatError:
        return ShardFormatError(
            f"truncated: {what} needs {n} bytes, the data ends at byte "
            f"{self._base + len(self._buf)}",
            url=self.url,
            offset=at,
        )

    def _take(self, n: int, what: str, at: int) -> bytes:
        """Return the next ``n`` bytes; raise naming header offset ``at`` if they run out."""
        if n <= _PIECE:
            if n >= _DIRECT and len(self._buf) - self._pos < n and self._can_seek():
                return self._take_direct(n, what, at)
            if not self._fill(n):
                raise self._truncated(what, n, at)
            p = self._pos
            self._pos = p + n
            return self._buf[p : p + n]
        return self._take_large(n, what, at)

    def _can_seek(self) -> bool:
        if self._direct is None:
            seekable = getattr(self.f, "seekable", None)
            self._direct = self.size is not None and seekable is not None and bool(seekable())
        return self._direct

    def _take_direct(self, n: int, what: str, at: int) -> bytes:
        """``n`` bytes read into their own object: the kernel copies them once, where
        joining the buffer with the rest would copy them twice more.

        The stream steps back over what the buffer holds of them. So that it rarely has
        to, the buffered read that follows is short: as long as the run from the end of
        the last directly read member to the start of this one, when that is short
        (samples tend to repeat their layout, so it ends where the next large member
        begins), else 8 KiB.
        """
        avail = len(self._buf) - self._pos
        try:
            if avail:
                self.f.seek(-avail, io.SEEK_CUR)
        except OSError as exc:
            raise ShardFormatError(f"seek failed: {exc}", url=self.url, offset=at) from exc
        self._base += self._pos
        gap = self._base - self._direct_end
        self._buf, self._pos = b"", 0
        data = self._read(n, self._base)
        self._base += len(data)
        while len(data) < n:  # a short read: rare for a file (a signal), or its end
            more = self._read(n - len(data), self._base)
            if not more:
                raise self._truncated(what, n, at)
            self._base += len(more)
            data += more
        self._direct_end = self._base
        self._chunk = gap if BLOCK <= gap <= _SHORT_GAP else _AFTER_DIRECT
        return data

    def _take_large(self, n: int, what: str, at: int) -> bytes:
        """``n`` bytes read in bounded pieces into one growing buffer: no joined copy.

        BytesIO grows its bytes object in place (realloc) and ``getvalue()`` hands that
        same object out, so the peak is the member plus one piece, not twice the member.
        """
        out = io.BytesIO()
        avail = len(self._buf) - self._pos
        if avail:
            out.write(memoryview(self._buf)[self._pos :])
        self._base += len(self._buf)
        self._buf, self._pos = b"", 0
        left = n - avail
        while left > 0:
            data = self._read(min(left, _PIECE), self._base)
            if not data:
                raise self._truncated(what, n, at)
            out.write(data)
            self._base += len(data)
            left -= len(data)
        return out.getvalue()

    def _skip(self, n: int, what: str, at: int) -> None:
        avail = len(self._buf) - self._pos
        seekable = getattr(self.f, "seekable", None)
        if n > avail and self.size is not None and seekable is not None and seekable():
            self.f.seek(n - avail, io.SEEK_CUR)
            self._base += len(self._buf) + (n - avail)
            self._buf = b""
            self._pos = 0
            return
        while n:
            piece = min(n, _CHUNK)
            self._take(piece, what, at)
            n -= piece

    def _check_claim(self, size: int, at: int, name: str) -> None:
        if self.size is not None and self.offset + size > self.size:
            raise ShardFormatError(
                f"member {name!r} claims {size} bytes, past the end of the data "
                f"({self.size} bytes): truncated or corrupt",
                url=self.url,
                offset=at,
            )

    def _discard(self, n: int, what: str, at: int) -> None:
        """Pass over ``n`` bytes without keeping them (each is still read, so hashed)."""
        avail = len(self._buf) - self._pos
        if n <= avail:
            self._pos += n
            return
        left = n - avail
        self._base += len(self._buf)
        self._buf, self._pos = b"", 0
        while left:
            data = self._read(min(left, _DISCARD), self._base)
            if not data:
                raise self._truncated(what, n, at)
            self._base += len(data)
            left -= len(data)

    def _member_data(self, size: int, at: int, name: str, *, keep: bool = True) -> bytes:
        self._check_claim(size, at, name)
        what = f"member {name!r}"
        if not keep:
            self._discard(size + (-size) % BLOCK, what, at)
            return b""
        if size > self.max_member:
            raise ShardFormatError(
                f"{what} is {size} bytes, over the largest-member limit of {self.max_member} "
                "bytes (raise it with max_member= or --max-member if this shard is trusted)",
                url=self.url,
                offset=at,
            )
        data = self._take(size, what, at)
        pad = (-size) % BLOCK
        if pad:
            if not self._fill(pad):
                raise self._truncated(f"the padding of {what}", pad, at)
            self._pos += pad
        return data

    def __iter__(self) -> Iterator[tuple[str, bytes | int]]:
        return self.members()

    def _header(self, off: int, first: int | None) -> bytes | None:
        """The next header block, or None at a clean end (end-of-archive or ``end``).

        ``first`` is the offset of the extended header this block must complete, if any.
        """
        if not self._fill(BLOCK):
            if len(self._buf) - self._pos:
                why, at = "truncated: partial tar header at the end of the data", off
            elif first is not None:
                why, at = "truncated: the data ends after an extended header", first
            elif self.end is None:
                why, at = "truncated: the data ends without an end-of-archive marker", off
            else:
                why, at = f"truncated: the data ends at byte {off}, before byte {self.end}", off
            raise ShardFormatError(why, url=self.url, offset=at)
        p = self._pos
        hdr = self._buf[p : p + BLOCK]
        self._pos = p + BLOCK
        if hdr == _ZERO:
            if first is not None:
                raise ShardFormatError(
                    "end-of-archive right after an extended header", url=self.url, offset=first
                )
            if self.end is None:
                self._second_zero_block(off)
            self.end_offset = off
            return None
        return hdr

    def _second_zero_block(self, off: int) -> None:
        """The end-of-archive marker is two zero blocks: a lone one means a cut-off shard."""
        if not self._fill(BLOCK) or self._buf[self._pos : self._pos + BLOCK] != _ZERO:
            raise ShardFormatError(
                "truncated: the end-of-archive marker has one zero block, not two",
                url=self.url,
                offset=off,
            )
        self._pos += BLOCK

    def _size_of(self, hdr: bytes, off: int) -> int:
        stored = hdr[148:156]
        try:
            if parse_number(stored) != sum(hdr) - sum(stored) + 256:
                raise ValueError("checksum")
        except ValueError:
            raise ShardFormatError(
                "not a tar header (bad header checksum)", url=self.url, offset=off
            ) from None
        try:
            return parse_number(hdr[124:136])
        except ValueError:
            raise ShardFormatError(
                f"bad size field {bytes(hdr[124:136])!r}", url=self.url, offset=off
            ) from None

    def _extended(self, typeflag: bytes, size: int, off: int, pax: dict[str, str]) -> None:
        """Read an extended header (pax ``x``/``g``, GNU ``L``/``K``) into ``pax``."""
        if size > _MAX_META:
            raise ShardFormatError(
                f"extended header of {size} bytes is too large", url=self.url, offset=off
            )
        data = self._member_data(size, off, "<extended header>")
        if typeflag == b"x":
            pax.update(parse_pax(data, self.url, off))
        elif typeflag == b"L":
            pax["path"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif typeflag == b"g":
            parse_pax(data, self.url, off)  # checked, but global records change nothing

    def _regular(self, hdr: bytes, size: int, first: int, pax: dict[str, str]) -> tuple[str, int]:
        """The checked name and size of a regular member whose headers start at ``first``."""
        name = pax.get("path") or ustar_name(hdr)
        if "size" in pax:
            if not (pax["size"].isascii() and pax["size"].isdigit()):
                raise ShardFormatError("pax size is not a number", url=self.url, offset=first)
            size = int(pax["size"])
        problem = name_problem(name)
        if problem is not None:
            raise ShardFormatError(f"member {name!r} {problem}", url=self.url, offset=first)
        return name, size

    def members(self) -> Iterator[tuple[str, bytes | int]]:
        """Yield ``(name, data)`` for each regular file; ``member_offset`` is its start.

        ``data`` is the member's size (an ``int``) when ``keep_data`` is off.
        """
        while True:
            item = self._next_member()
            if item is None:
                return
            yield item

    def _next_member(self) -> tuple[str, bytes | int] | None:
        """The next regular member (through any extended headers), or None at the end."""
        pax: dict[str, str] = {}  # extended records (and a GNU long name as "path")
        first: int | None = None  # offset of the current member's first (extended) header
        while True:
            off = self._base + self._pos
            if self.end is not None and off >= self.end and first is None:
                self.end_offset = off
                return None
            hdr = self._header(off, first)
            if hdr is None:
                return None
            size = self._size_of(hdr, off)
            if first is None:
                first = off
            typeflag = hdr[156:157]
            if typeflag in _REGULAR:
                name, size = self._regular(hdr, size, first, pax)
                self.member_offset = first
                data = self._member_data(size, first, name, keep=self.keep_data)
                return name, (data if self.keep_data else size)
            if typeflag == b"5":
                self._check_claim(size, off, "<directory>")
                self._skip(size + (-size) % BLOCK, "directory", off)
                pax, first = {}, None
            elif typeflag in (b"x", b"L", b"g", b"K"):
                self._extended(typeflag, size, off, pax)
                if typeflag == b"g" and first == off:
                    first = None
            elif typeflag in _REJECT:
                raise ShardFormatError(
                    f"member is a {_REJECT[typeflag]}; shards may hold only regular files",
                    url=self.url,
                    offset=off,
                )
            else:
                raise ShardFormatError(
                    f"unsupported tar member type {typeflag!r}", url=self.url, offset=off
                )


def stream_size(f: BinaryIO) -> int | None:
    """The size of the plain file behind ``f``, or None (pipes, sockets, decoders)."""
    try:
        st = os.fstat(f.fileno())
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
