"""The streaming tar reader: the hot path of every read.

Headers are parsed straight out of large buffered reads; small members are sliced out of
the same buffer, large ones are read in bounded pieces. Hostile members (absolute or
``..`` paths, links, devices, sizes past the end of the data, bad header checksums) raise
:class:`ShardFormatError` naming the shard and the byte offset. Memory stays bounded by
the data actually present, whatever a header claims.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import BinaryIO

from shardkit.errors import ShardFormatError

__all__ = ["TarReader", "iter_members", "iter_samples", "read_shard", "split_key"]

BLOCK = 512
_ZERO = b"\0" * BLOCK
_CHUNK = 1 << 20
_PIECE = 64 << 20  # large members are read in pieces of this size
_MAX_META = 1 << 20  # pax / GNU long-name records larger than this are hostile
_REGULAR = (b"0", b"\0", b"7")
_REJECT = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
}

Sample = dict[str, object]


def split_key(name: str) -> tuple[str, str] | None:
    """Split ``dir/abc.tokens.npy`` into ``("dir/abc", "tokens.npy")``; None without a dot."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None
    return name[:dot], name[dot + 1 :]


def _parse_octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise ShardFormatError("malformed pax header record", url=url, offset=offset) from None
        if sp < 0 or length <= 0 or pos + length > len(data):
            raise ShardFormatError("malformed pax header record", url=url, offset=offset)
        rec = data[sp + 1 : pos + length - 1]
        k, eq, v = rec.partition(b"=")
        if not eq:
            raise ShardFormatError("malformed pax header record", url=url, offset=offset)
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _check_name(name: str, url: str, offset: int) -> None:
    if not name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ShardFormatError(f"member {name!r} has an absolute path", url=url, offset=offset)
    if "\\" in name or ".." in name.split("/"):
        raise ShardFormatError(f"member {name!r} escapes its directory", url=url, offset=offset)


class TarReader:
    """Iterate the regular members of a tar stream.

    Args:
        f: a binary stream positioned at ``start`` (a member header).
        url: the shard's name, used in error messages.
        start: the absolute byte offset ``f`` is positioned at.
        end: stop before this absolute offset (a sample-range read); None reads to the
            end-of-archive marker, which must be present.
        size: the stream's total size when known; a member claiming bytes past it is
            rejected before anything is read.
    """

    def __init__(
        self,
        f: BinaryIO,
        *,
        url: str = "<stream>",
        start: int = 0,
        end: int | None = None,
        size: int | None = None,
    ) -> None:
        self.f = f
        self.url = url
        self.end = end
        self.size = size if size is not None else _stream_size(f, start)
        self._buf = b""
        self._pos = 0
        self._base = start  # absolute offset of _buf[0]
        self.member_offset = start  # where the last member (with its pax headers) began

    @property
    def offset(self) -> int:
        """The absolute offset of the next unread byte."""
        return self._base + self._pos

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at _pos; False at a clean end of stream."""
        avail = len(self._buf) - self._pos
        if avail >= need:
            return True
        parts = [self._buf[self._pos :]] if avail else []
        self._base += self._pos
        self._pos = 0
        want = max(need, _CHUNK) - avail
        while want > 0:
            try:
                data = self.f.read(want)
            except OSError as exc:
                raise ShardFormatError(
                    f"read failed: {exc}", url=self.url, offset=self._base + avail
                ) from exc
            if not data:
                break
            parts.append(data)
            avail += len(data)
            want -= len(data)
            if avail >= need:
                break
        self._buf = b"".join(parts) if len(parts) != 1 else parts[0]
        return avail >= need

    def _take(self, n: int, what: str) -> bytes:
        """Return the next ``n`` bytes; raise when the stream ends first."""
        if n <= _PIECE:
            if not self._fill(n):
                raise ShardFormatError(
                    f"truncated: {what} needs {n} bytes, the data ends at byte "
                    f"{self._base + len(self._buf)}",
                    url=self.url,
                    offset=self.offset,
                )
            p = self._pos
            self._pos = p + n
            return self._buf[p : p + n]
        pieces = []
        left = n
        while left:
            piece = min(left, _PIECE)
            pieces.append(self._take(piece, what))
            left -= piece
        return b"".join(pieces)

    def _skip(self, n: int, what: str) -> None:
        if n > _CHUNK and len(self._buf) - self._pos < n and hasattr(self.f, "seek"):
            try:
                avail = len(self._buf) - self._pos
                self.f.seek(n - avail, io.SEEK_CUR)
                self._base += len(self._buf) + (n - avail)
                self._buf = b""
                self._pos = 0
                return
            except (OSError, io.UnsupportedOperation):
                pass
        while n:
            piece = min(n, _PIECE)
            self._take(piece, what)
            n -= piece

    def _member_data(self, size: int, offset: int, name: str) -> bytes:
        if self.size is not None and self.offset + size > self.size:
            raise ShardFormatError(
                f"member {name!r} claims {size} bytes, past the end of the data "
                f"({self.size} bytes)",
                url=self.url,
                offset=offset,
            )
        data = self._take(size, f"member {name!r}")
        pad = (-size) % BLOCK
        if pad:
            if not self._fill(pad):
                raise ShardFormatError(
                    f"truncated inside the padding of member {name!r}",
                    url=self.url,
                    offset=self.offset,
                )
            self._pos += pad
        return data

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return self.members()

    def members(self) -> Iterator[tuple[str, bytes]]:
        """Yield ``(name, data)`` for each regular file; ``member_offset`` is its start."""
        url = self.url
        end = self.end
        long_name: str | None = None
        pax: dict[str, str] = {}
        start_of_member: int | None = None
        while True:
            off = self._base + self._pos
            if end is not None and off >= end and start_of_member is None:
                return
            if not self._fill(BLOCK):
                if len(self._buf) - self._pos:
                    raise ShardFormatError(
                        "truncated: partial tar header at the end of the data",
                        url=url,
                        offset=off,
                    )
                if end is None or start_of_member is not None:
                    raise ShardFormatError(
                        "truncated: the data ends without an end-of-archive marker",
                        url=url,
                        offset=off,
                    )
                if off < end:
                    raise ShardFormatError(
                        f"truncated: the data ends at byte {off}, before byte {end}",
                        url=url,
                        offset=off,
                    )
                return
            p = self._pos
            hdr = self._buf[p : p + BLOCK]
            self._pos = p + BLOCK
            if hdr == _ZERO:
                if start_of_member is not None:
                    raise ShardFormatError(
                        "end-of-archive inside an extended header", url=url, offset=off
                    )
                return
            stored = hdr[148:156]
            chk = sum(hdr) - sum(stored) + 256
            try:
                if _parse_octal(stored) != chk:
                    raise ValueError
                size = _parse_octal(hdr[124:136])
            except ValueError:
                raise ShardFormatError(
                    "not a tar header (bad header checksum)", url=url, offset=off
                ) from None
            if start_of_member is None:
                start_of_member = off
            typeflag = hdr[156:157]
            if typeflag in _REGULAR:
                if long_name is not None:
                    name = long_name
                elif "path" in pax:
                    name = pax["path"]
                else:
                    nul = hdr.find(b"\0", 0, 100)
                    raw = hdr[: nul if nul >= 0 else 100]
                    if hdr[257:263] == b"ustar\x00" and hdr[345] != 0:
                        nul = hdr.find(b"\0", 345, 500)
                        raw = hdr[345 : nul if nul >= 0 else 500] + b"/" + raw
                    name = raw.decode("utf-8", "surrogateescape")
                if pax and "size" in pax:
                    try:
                        size = int(pax["size"])
                    except ValueError:
                        raise ShardFormatError(
                            "pax size is not a number", url=url, offset=off
                        ) from None
                _check_name(name, url, start_of_member)
                self.member_offset = start_of_member
                data = self._member_data(size, off, name)
                long_name = None
                if pax:
                    pax = {}
                start_of_member = None
                yield name, data
            elif typeflag == b"5":
                self._skip(size + (-size) % BLOCK, "directory")
                long_name, pax, start_of_member = None, {}, None
            elif typeflag in (b"x", b"L", b"g", b"K"):
                if size > _MAX_META:
                    raise ShardFormatError(
                        f"extended header of {size} bytes is too large", url=url, offset=off
                    )
                data = self._member_data(size, off, "<extended header>")
                if typeflag == b"x":
                    pax.update(_parse_pax(data, url, off))
                elif typeflag == b"L":
                    long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif typeflag == b"g" and start_of_member == off:
                    start_of_member = None
            elif typeflag in _REJECT:
                raise ShardFormatError(
                    f"member is a {_REJECT[typeflag]}; shards may hold only regular files",
                    url=url,
                    offset=off,
                )
            else:
                raise ShardFormatError(
                    f"unsupported tar member type {typeflag!r}", url=url, offset=off
                )


def _stream_size(f: BinaryIO, start: int) -> int | None:
    try:
        fileno = f.fileno()
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None
    try:
        st = os.fstat(fileno)
    except OSError:
        return None
    import stat

    return st.st_size if stat.S_ISREG(st.st_mode) else None


def iter_members(
    f: BinaryIO, *, url: str = "<stream>", start: int = 0, end: int | None = None
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, data)`` for each regular file member of a tar stream."""
    return TarReader(f, url=url, start=start, end=end).members()


def iter_samples(
    f: BinaryIO,
    *,
    url: str = "<stream>",
    start: int = 0,
    end: int | None = None,
    size: int | None = None,
) -> Iterator[tuple[int, Sample]]:
    """Yield ``(byte_offset, sample)``: consecutive members sharing a key, grouped.

    A sample is ``{"__key__": key, field: bytes, ...}``; members whose basename has no
    dot carry no field and are skipped (as WebDataset does).
    """
    reader = TarReader(f, url=url, start=start, end=end, size=size)
    current: Sample | None = None
    key: str | None = None
    sample_offset = start
    for name, data in reader.members():
        kf = split_key(name)
        if kf is None:
            continue
        k, field = kf
        if k != key:
            if current is not None:
                yield sample_offset, current
            key = k
            current = {"__key__": k}
            sample_offset = reader.member_offset
        elif field in current:  # type: ignore[operator]
            raise ShardFormatError(
                f"sample {k!r} has field {field!r} twice", url=url, offset=reader.member_offset
            )
        current[field] = data  # type: ignore[index]
    if current is not None:
        yield sample_offset, current


def read_shard(
    source: str | os.PathLike[str] | BinaryIO,
    *,
    url: str | None = None,
    start: int = 0,
    end: int | None = None,
) -> Iterator[Sample]:
    """Iterate the samples of a tar shard (a path or a binary stream).

    Each sample is a dict with ``__key__`` and one ``bytes`` value per field. A path ending
    in ``.zst`` is decompressed on the fly. ``start``/``end`` read a byte range (a sample
    range taken from the shard's index).
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        name = url or path
        return _read_path(path, name, start, end)
    name = url or getattr(source, "name", None) or "<stream>"
    return (s for _, s in iter_samples(source, url=str(name), start=start, end=end))


def _read_path(path: str, url: str, start: int, end: int | None) -> Iterator[Sample]:
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the generator
    except OSError as exc:
        raise ShardFormatError(f"cannot open shard: {exc.strerror}", url=url) from exc
    with f:
        if path.endswith(".zst"):
            from shardkit.codecs import zstd_reader

            with zstd_reader(f) as z:
                if start:
                    _discard(z, start)
                yield from (s for _, s in iter_samples(z, url=url, start=start, end=end))
            return
        if start:
            f.seek(start)
        yield from (s for _, s in iter_samples(f, url=url, start=start, end=end))


def _discard(f: BinaryIO, n: int) -> None:
    while n:
        got = f.read(min(n, _PIECE))
        if not got:
            return
        n -= len(got)
