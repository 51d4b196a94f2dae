"""The tar header rules, each spelled once: number fields, the header checksum, pax records.

The reader has a general path (every field parsed, every error named) and fast paths for
the common member shapes; both use these functions, so that they cannot disagree. The fast
forms (:func:`octal_field`, :func:`plain_header`) take only what needs no second look and
answer None (or False) when in doubt; the general path then decides and names the error.
"""

from __future__ import annotations

import re
import struct
from zlib import adler32

from shardkit.errors import ShardFormatError
from shardkit.format.tario.names import PLAIN_NAME

__all__ = [
    "BLOCK",
    "ZERO_BLOCK",
    "checksum_ok",
    "octal_field",
    "parse_number",
    "parse_pax",
    "plain_header",
    "plain_member",
    "sum_matches",
    "ustar_name",
]

BLOCK = 512
ZERO_BLOCK = b"\0" * BLOCK
_OCTAL = frozenset(b"01234567")
_OCTAL_DIGITS = b"01234567"
# name, size, checksum, typeflag and the first byte of the ustar prefix, in one call
_PLAIN = struct.Struct("100s24x12s12x8sc188xc")
# plain_header's checks and fast_name's in one match: the name (up to its NUL), the size
# field, the checksum field (and its six digits), then no ustar prefix
_MEMBER = re.compile(
    rb"(?=(" + PLAIN_NAME.pattern + rb")\0)(?s:.{124})([0-7]{11})[\0 ](?s:.{12})"
    rb"(([0-7]{6})[\0 ](?s:.))[0\0](?s:.{188})\0"
)
# pax records the 0.0 sparse format repeats: kept in order, joined with commas
_REPEATED = frozenset(("GNU.sparse.offset", "GNU.sparse.numbytes"))


def parse_number(field: bytes) -> int:
    """A header number: octal digits (NUL/space padded) or GNU base-256; ValueError if bad."""
    if field[:1] and field[0] & 0x80:  # GNU base-256: big-endian two's complement
        if field[0] & 0x40:
            raise ValueError("negative number")
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not _OCTAL.issuperset(text):
        raise ValueError("not octal")
    return int(text, 8) if text else 0


def octal_field(field: bytes, digits: int) -> bool:
    """Whether a number field is the plain form: ``digits`` (6 or 11) octal digits, then NUL
    or space."""
    return not field[:digits].strip(_OCTAL_DIGITS) and field[digits] in (0, 32)


def sum_matches(block: bytes, chkf: bytes) -> bool:
    """The unsigned checksum of a header block whose checksum field ``chkf`` is plain octal.

    Through adler32, whose low half is 1 + the byte sum (mod 65521): C instead of a Python
    sum over 512 bytes. The field itself counts as eight spaces.
    """
    return (adler32(block) & 0xFFFF) == (int(chkf[:6], 8) - 255 + sum(chkf)) % 65521


def checksum_ok(hdr: bytes) -> bool:
    """Whether the header block's checksum is right, as unsigned or as signed bytes.

    POSIX sums the bytes unsigned; some old writers (SunOS, early GNU tar) summed them as
    signed chars, and tarfile and GNU tar accept either. A field that is not a number is
    wrong.
    """
    chkf = hdr[148:156]
    if octal_field(chkf, 6) and sum_matches(hdr, chkf):
        return True
    try:
        stored = parse_number(chkf)
    except ValueError:
        return False
    unsigned = sum(hdr) - sum(chkf) + 256
    if stored == unsigned:
        return True
    high = sum(1 for b in hdr[:148] if b > 127) + sum(1 for b in hdr[156:] if b > 127)
    return stored == unsigned - 256 * high


def plain_header(buf: bytes, p: int) -> tuple[bytes, int, bool] | None:
    """``(raw name, size, has a ustar prefix)`` of the header block at ``buf[p:]`` when it is
    a regular file in the plain form (octal size and checksum fields, the checksum right),
    or None when in doubt (the general path decides). ``buf`` holds the whole block.

    The checks are :func:`octal_field` and :func:`sum_matches` written out: three calls
    per member cost ~7% of a read of small samples. ``tests/property/test_fast_reader.py``
    pins this function to them and to the general path's :func:`checksum_ok`.
    """
    raw, sizef, chkf, tf, prefix0 = _PLAIN.unpack_from(buf, p)
    if (
        (tf == b"0" or tf == b"\0")
        and not sizef[:11].strip(_OCTAL_DIGITS)
        and sizef[11] in (0, 32)
        and not chkf[:6].strip(_OCTAL_DIGITS)
        and chkf[6] in (0, 32)
        and (adler32(buf[p : p + BLOCK]) & 0xFFFF) == (int(chkf[:6], 8) - 255 + sum(chkf)) % 65521
    ):
        return raw.partition(b"\0")[0], int(sizef[:11], 8), prefix0 != b"\0"
    return None


def plain_member(buf: bytes, p: int) -> tuple[str, int] | None:
    """``(name, size)`` of the header block at ``buf[p:]`` when :func:`plain_header` takes
    it with no ustar prefix and :func:`~shardkit.format.tario.names.fast_name` takes its
    name, or None when in doubt (a name filling its 100 bytes, with no NUL to end it, is
    left to the general path). One regular expression does both checks' work (and the
    name's) in one call; ``tests/property/test_fast_reader.py`` pins it to the two."""
    m = _MEMBER.match(buf, p)
    if m is None:
        return None
    raw, sizef, chkf, digits = m.groups()
    if (
        len(raw) >= 100
        or (adler32(buf[p : p + BLOCK]) & 0xFFFF) != (int(digits, 8) - 255 + sum(chkf)) % 65521
    ):
        return None
    try:
        return raw.decode(), int(sizef, 8)
    except UnicodeDecodeError:
        return None


def _bad_pax(url: str, offset: int, why: str) -> ShardFormatError:
    return ShardFormatError(f"malformed pax header record: {why}", url=url, offset=offset)


def parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    """Parse pax records ``"%d %s=%s\n"``; every malformation names the header's offset.

    A value that is not UTF-8 is kept as surrogate escapes (as tarfile does). The records
    the 0.0 sparse format repeats (``GNU.sparse.offset``/``numbytes``) are joined in order
    with commas; any other repeated keyword keeps its last value.
    """
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # some writers pad the record block with NULs
            break
        sp = data.find(b" ", pos, pos + 21)
        digits = data[pos:sp] if sp > pos else b""
        if not digits or not digits.isdigit():
            raise _bad_pax(url, offset, "no record length")
        length = int(digits)
        if length <= sp + 1 - pos or pos + length > len(data):
            raise _bad_pax(url, offset, f"record length {length} does not fit")
        if data[pos + length - 1] != 0x0A:
            raise _bad_pax(url, offset, "record does not end with a newline")
        k, eq, v = data[sp + 1 : pos + length - 1].partition(b"=")
        if not eq or not k:
            raise _bad_pax(url, offset, "record has no 'keyword='")
        key = k.decode("utf-8", "replace")
        value = v.decode("utf-8", "surrogateescape")
        if key in _REPEATED and key in out:
            value = out[key] + "," + value
        out[key] = value
        pos += length
    return out


def ustar_name(hdr: bytes) -> str:
    """The member name of a header block: its name field, after its POSIX prefix if any;
    bytes that are not UTF-8 are kept as surrogate escapes (as tarfile does)."""
    nul = hdr.find(b"\0", 0, 100)
    raw = hdr[: nul if nul >= 0 else 100]
    if hdr[257:263] == b"ustar\x00" and hdr[345] != 0:  # POSIX prefix (not GNU's 'ustar  ')
        nul = hdr.find(b"\0", 345, 500)
        raw = hdr[345 : nul if nul >= 0 else 500] + b"/" + raw
    return raw.decode("utf-8", "surrogateescape")
