"""GNU sparse members: their maps, checked, and their data expanded as tarfile expands it.

A sparse member stores only the chunks of a file that hold data, with a map of where each
chunk goes; the file read back is zeros everywhere else. Four spellings exist:

- old GNU (type ``S``, ``--format=gnu|oldgnu``): four map entries in the header, more in
  extension blocks after it, the expanded size at byte 483;
- pax 0.0 (GNU tar 1.14-1.15): repeated ``GNU.sparse.offset``/``numbytes`` records;
- pax 0.1: one ``GNU.sparse.map`` record of ``offset,size,...``;
- pax 1.0 (GNU tar's default, also Go's and libarchive's writers): the map as decimal
  lines at the start of the member's data, padded to a block; the header's name is
  ``./GNUSparseFile.N/name`` and ``GNU.sparse.name`` holds the real one.

A map is refused (a ``ValueError`` saying why, which the reader names with the shard and
offset) unless its chunks are in order, do not overlap, fit the expanded size, and cover
exactly the bytes the member stores. Zero-length entries (GNU tar ends a map with one)
carry nothing and are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.format.tario.headers import BLOCK, parse_number

__all__ = [
    "MAX_ENTRIES",
    "SparseMap",
    "expand",
    "is_sparse",
    "make_map",
    "map_text",
    "old_gnu_entries",
    "pax_entries",
]

MAX_ENTRIES = 1 << 16  # more map entries than this is hostile
_PAX_10 = ("1", "0")


@dataclass(frozen=True)
class SparseMap:
    """A checked map: the expanded ``size`` and the ``(offset, numbytes)`` data chunks."""

    size: int
    chunks: tuple[tuple[int, int], ...]


def is_sparse(pax: dict[str, str]) -> bool:
    """Whether pax records make the member that follows sparse (any ``GNU.sparse.*``)."""
    return any(k.startswith("GNU.sparse.") for k in pax)


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} {text!r} is not a number")
    return int(text)


def _pairs(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) % 2:
        raise ValueError("the map has an odd count of numbers")
    if len(numbers) > 2 * MAX_ENTRIES:
        raise ValueError(f"the map has more than {MAX_ENTRIES} entries")
    return list(zip(numbers[::2], numbers[1::2], strict=True))


def pax_entries(pax: dict[str, str]) -> tuple[int, list[tuple[int, int]] | None]:
    """``(expanded size, entries)`` of a pax sparse member: entries for 0.0 and 0.1, None
    for 1.0 (its map is in the data: :func:`map_text`). Versions are told as tarfile tells
    them; anything else with ``GNU.sparse.*`` records is a ValueError."""
    if "GNU.sparse.map" in pax:  # 0.1
        text = pax["GNU.sparse.map"]
        numbers = [_number(x, "map entry") for x in text.split(",")] if text else []
        return _number(pax.get("GNU.sparse.size", ""), "GNU.sparse.size"), _pairs(numbers)
    if "GNU.sparse.size" in pax:  # 0.0
        offsets = pax.get("GNU.sparse.offset", "")
        counts = pax.get("GNU.sparse.numbytes", "")
        off = [_number(x, "GNU.sparse.offset") for x in offsets.split(",")] if offsets else []
        num = [_number(x, "GNU.sparse.numbytes") for x in counts.split(",")] if counts else []
        if len(off) != len(num):
            raise ValueError(f"{len(off)} offsets but {len(num)} sizes")
        flat = [x for pair in zip(off, num, strict=True) for x in pair]
        return _number(pax["GNU.sparse.size"], "GNU.sparse.size"), _pairs(flat)
    if (pax.get("GNU.sparse.major"), pax.get("GNU.sparse.minor")) == _PAX_10:
        return _number(pax.get("GNU.sparse.realsize", ""), "GNU.sparse.realsize"), None
    version = f"{pax.get('GNU.sparse.major', '?')}.{pax.get('GNU.sparse.minor', '?')}"
    raise ValueError(f"unknown GNU sparse format (version {version})")


def map_text(data: bytes) -> tuple[list[tuple[int, int]], int] | None:
    """The pax 1.0 map at the start of ``data``: ``(entries, the bytes it takes in whole
    blocks)``, or None when ``data`` ends before the map does (read another block)."""
    lines = data.split(b"\n")
    if len(lines) < 2:
        return None
    count = _number(lines[0].decode("ascii", "replace"), "map entry count")
    if count > MAX_ENTRIES:
        raise ValueError(f"the map has more than {MAX_ENTRIES} entries")
    if len(lines) < 2 * count + 2:  # the count, 2 * count numbers, what follows the last
        return None
    numbers = [_number(x.decode("ascii", "replace"), "map entry") for x in lines[1 : 2 * count + 1]]
    used = sum(len(x) + 1 for x in lines[: 2 * count + 1])
    return _pairs(numbers), used + (-used) % BLOCK


def old_gnu_entries(block: bytes, start: int, count: int) -> list[tuple[int, int]]:
    """``count`` old GNU map entries (12-byte offset, 12-byte size) from ``block[start:]``."""
    out = []
    for i in range(count):
        at = start + 24 * i
        try:
            out.append((parse_number(block[at : at + 12]), parse_number(block[at + 12 : at + 24])))
        except ValueError:
            raise ValueError(f"map entry {i} is not a number") from None
    return out


def make_map(size: int, entries: list[tuple[int, int]], stored: int) -> SparseMap:
    """Check ``entries`` against the expanded ``size`` and the ``stored`` byte count."""
    chunks = [(off, n) for off, n in entries if n]
    end = 0
    for off, n in chunks:
        if off < end:
            raise ValueError(f"chunk at {off} overlaps or precedes the one before")
        end = off + n
        if end > size:
            raise ValueError(f"chunk at {off} of {n} bytes ends past the size {size}")
    covered = sum(n for _, n in chunks)
    if covered != stored:
        raise ValueError(f"the map covers {covered} bytes, the member stores {stored}")
    return SparseMap(size, tuple(chunks))


def expand(stored: bytes, sparse: SparseMap) -> bytes:
    """The file ``stored`` makes under ``sparse``: zeros but where a chunk puts data."""
    view = memoryview(stored)
    parts: list[bytes | memoryview] = []
    pos = at = 0
    for off, n in sparse.chunks:
        if off > at:
            parts.append(bytes(off - at))
        parts.append(view[pos : pos + n])
        pos += n
        at = off + n
    if sparse.size > at:
        parts.append(bytes(sparse.size - at))
    return b"".join(parts)
