"""Parsing the fields of tar header blocks: numbers, pax records, ustar names."""

from __future__ import annotations

from shardkit.errors import ShardFormatError

__all__ = ["parse_number", "parse_pax", "ustar_name"]

_OCTAL = frozenset(b"01234567")


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


def _bad_pax(url: str, offset: int, why: str) -> ShardFormatError:
    return ShardFormatError(f"malformed pax header record: {why}", url=url, offset=offset)


def parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    """Parse pax records ``"%d %s=%s\n"``; every malformation names the header's offset."""
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
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def ustar_name(hdr: bytes) -> str:
    nul = hdr.find(b"\0", 0, 100)
    raw = hdr[: nul if nul >= 0 else 100]
    if hdr[257:263] == b"ustar\x00" and hdr[345] != 0:  # POSIX prefix (not GNU's 'ustar  ')
        nul = hdr.find(b"\0", 345, 500)
        raw = hdr[345 : nul if nul >= 0 else 500] + b"/" + raw
    return raw.decode("utf-8", "surrogateescape")
