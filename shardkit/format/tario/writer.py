"""Encode tar members: plain ustar headers, a pax header only where a name or size needs one.

Headers are fixed (mtime 0, uid/gid 0, mode 0444, no user names) so the same samples give
byte-identical shards.
"""

from __future__ import annotations

from shardkit.errors import WriterError
from shardkit.format.tario.names import key_problem, normal_key

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "TarBuilder",
    "check_field",
    "check_key",
    "member_header",
    "padding",
]

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_MAX_OCTAL_SIZE = 0o77777777777  # 11 octal digits: 8 GiB - 1
_ZERO_PAD = b"\0" * BLOCK


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _raw_header(name: bytes, prefix: bytes, size: int, typeflag: bytes) -> bytes:
    hdr = bytearray(BLOCK)
    hdr[0 : len(name)] = name
    hdr[100:108] = _octal(0o444, 8)
    hdr[108:116] = _octal(0, 8)
    hdr[116:124] = _octal(0, 8)
    hdr[124:136] = _octal(size, 12)
    hdr[136:148] = _octal(0, 12)
    hdr[148:156] = b"        "
    hdr[156:157] = typeflag
    hdr[257:263] = b"ustar\x00"
    hdr[263:265] = b"00"
    hdr[329:337] = _octal(0, 8)
    hdr[337:345] = _octal(0, 8)
    hdr[345 : 345 + len(prefix)] = prefix
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a name into ustar (prefix, name) or return None when it does not fit."""
    if len(name) <= 100:
        return b"", name
    if len(name) > 256:
        return None
    # the prefix must end at a '/', the rest must fit in 100 bytes
    cut = name.find(b"/", len(name) - 101)
    while cut != -1:
        if cut <= 155 and len(name) - cut - 1 <= 100 and cut > 0:
            return name[:cut], name[cut + 1 :]
        cut = name.find(b"/", cut + 1)
    return None


def _pax_record(keyword: str, value: bytes) -> bytes:
    body = b" " + keyword.encode() + b"=" + value + b"\n"
    n = len(body) + 1
    while True:
        rec = str(n).encode() + body
        if len(rec) == n:
            return rec
        n = len(rec)


def padding(size: int) -> bytes:
    """The zero bytes that pad a member of ``size`` bytes to a whole block."""
    return _ZERO_PAD[: (-size) % BLOCK]


# The constant parts of a plain ustar header as _raw_header writes it, for the fast path.
_MID = _octal(0o444, 8) + _octal(0, 8) + _octal(0, 8)  # mode, uid, gid
_MTIME = _octal(0, 12)
_TAIL = (
    b"0"  # typeflag: regular file
    + b"\0" * 100  # linkname
    + b"ustar\x0000"  # magic, version
    + b"\0" * 64  # uname, gname
    + _octal(0, 8)
    + _octal(0, 8)  # devmajor, devminor
    + b"\0" * 167  # prefix and the block's padding
)
_CONST_SUM = sum(_MID) + sum(_MTIME) + sum(_TAIL) + 8 * 32  # checksum field counts as spaces
_NUL100 = b"\0" * 100


def member_header(name: str, size: int) -> bytes:
    """Return the header block(s) for a regular file ``name`` of ``size`` bytes."""
    raw = name.encode("utf-8")
    if len(raw) <= 100 and size <= _MAX_OCTAL_SIZE and raw.isascii():
        # the common case, byte for byte what _raw_header(raw, b"", size, b"0") gives
        sizef = b"%011o\0" % size
        chk = b"%06o\0 " % (_CONST_SUM + sum(raw) + sum(sizef))
        return b"".join((raw, _NUL100[len(raw) :], _MID, sizef, _MTIME, chk, _TAIL))
    pax: list[bytes] = []
    split = _split_ustar(raw) if raw.isascii() else None
    if split is None:
        pax.append(_pax_record("path", raw))
        short = raw.decode("ascii", "replace")[-100:].encode("ascii", "replace")
        split = (b"", short)
    if size > _MAX_OCTAL_SIZE:
        pax.append(_pax_record("size", str(size).encode()))
    header = _raw_header(split[1], split[0], min(size, _MAX_OCTAL_SIZE), b"0")
    if not pax:
        return header
    body = b"".join(pax)
    pax_name = b"PaxHeaders/" + split[1][-80:]
    return _raw_header(pax_name, b"", len(body), b"x") + body + padding(len(body)) + header


def check_key(key: str) -> str:
    """``key`` in the form the reader gives it back (a leading ``./`` dropped); raise
    :class:`WriterError` unless that form round-trips through a tar member name."""
    if not isinstance(key, str) or not key:
        raise WriterError(f"sample key must be a non-empty string, got {key!r}")
    normal = normal_key(key)
    problem = key_problem(normal)
    if problem is not None:
        raise WriterError(f"sample key {key!r} {problem}")
    return normal


def check_field(key: str, field: str) -> None:
    """Raise :class:`WriterError` unless ``field`` is a usable field (extension) name."""
    if not isinstance(field, str) or not field or "/" in field or "\0" in field or "\\" in field:
        raise WriterError(f"sample {key!r}: bad field name {field!r}")
    if field.startswith(".") or field.endswith("."):
        raise WriterError(f"sample {key!r}: field {field!r} must not start or end with '.'")
    try:
        field.encode("utf-8")
    except UnicodeEncodeError:
        raise WriterError(f"sample {key!r}: field {field!r} is not valid UTF-8") from None


class TarBuilder:
    """Builds tar bytes member by member into a buffer the caller drains."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray | memoryview] = []
        self.size = 0

    def add(self, name: str, data: bytes | bytearray | memoryview) -> int:
        """Append one member; return the bytes it takes on disk."""
        n = len(data)
        header = member_header(name, n)
        pad = padding(n)
        self.parts.append(header)
        self.parts.append(data)
        if pad:
            self.parts.append(pad)
        total = len(header) + n + len(pad)
        self.size += total
        return total

    def drain(self) -> list[bytes | bytearray | memoryview]:
        """Take the pending pieces, leaving the builder empty."""
        parts, self.parts = self.parts, []
        self.size = 0
        return parts
