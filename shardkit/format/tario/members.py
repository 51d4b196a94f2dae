"""The member layer of the tar reader: header parsing, member kinds, hostile-input checks.

:class:`MemberReader` is the general (slow) path that names every error; the sample loop
and its fast paths (:mod:`shardkit.format.tario.reader`) fall back to it, and both use the
rules of :mod:`~shardkit.format.tario.headers` and :mod:`~shardkit.format.tario.names`.
Hostile members (absolute or ``..`` paths, sizes past the end of the data, bad header
checksums, bad sparse maps) raise :class:`ShardFormatError` naming the shard and offset.

What each header type gives (docs/format.md says why):

- regular files (``0``, NUL, ``7``) and GNU sparse files (type ``S`` and the pax sparse
  formats, expanded as tarfile expands them) are members;
- pax (``x``, Solaris ``X``) and GNU long-name (``L``, ``K``) headers describe the next
  member (what its name and size are, or why readers disagree on them, is decided in one
  place: :func:`~shardkit.format.tario.extended.member_facts`); a global pax header
  (``g``) is checked and, unless it sets a name or size
  (refused: it would apply to every member after it), changes nothing;
- directories (``5``, and old-style names ending in ``/``) are passed over, never data;
- volume labels (``V``), Solaris ACLs (``A``) and GNU dump directories (``D``) are
  metadata: skipped, with a count and a warning, under every policy;
- links (``1``, ``2``), devices (``3``, ``4``), FIFOs (``6``) and unknown types are refused
  under the default ``"strict"`` policy and skipped, counted and warned under ``"lenient"``.
"""

from __future__ import annotations

import logging

from shardkit.errors import ConfigError, ShardFormatError
from shardkit.format.tario import sparse
from shardkit.format.tario.buffer import Buffered
from shardkit.format.tario.extended import Extended, MemberFacts, member_facts
from shardkit.format.tario.headers import (
    BLOCK,
    ZERO_BLOCK,
    checksum_ok,
    parse_number,
    parse_pax,
)
from shardkit.format.tario.names import name_problem

__all__ = ["TAR_POLICIES", "MemberReader"]

logger = logging.getLogger(__name__)

TAR_POLICIES = ("strict", "lenient")
_MAX_META = 1 << 20  # pax / GNU long-name records (and sparse maps) larger are hostile
_REGULAR = (b"0", b"\0", b"7", b"S")
_EXTENDED = (b"x", b"X", b"g", b"L", b"K")
# no data in the archive (POSIX); refused unless the policy is lenient
_NO_DATA = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
}
_METADATA = {b"V": "volume label", b"A": "Solaris ACL", b"D": "GNU dump directory"}
# global pax records that would change every member after them
_GLOBAL_REFUSED = ("path", "size", "linkpath")


class MemberReader:
    """The general (slow) path of the tar reader over the byte layer ``src``: the next
    regular member through any extended headers, every member kind and hostile-input
    check, each error naming the header block at fault.

    :attr:`skipped` counts the members passed over, by kind (``"directory"``,
    ``"symbolic link"``, ``"type 'Q'"``, ...); ``policy`` is as
    :class:`~shardkit.format.tario.reader.TarReader` takes it.
    """

    def __init__(self, src: Buffered, *, policy: str = "strict") -> None:
        if policy not in TAR_POLICIES:
            raise ConfigError(f"tar policy must be one of {TAR_POLICIES}, got {policy!r}")
        self.src = src
        self.policy = policy
        self.skipped: dict[str, int] = {}
        self._told = False

    def _error(self, why: str, at: int) -> ShardFormatError:
        return ShardFormatError(why, url=self.src.url, offset=at)

    def _header(self, off: int, first: int | None) -> bytes | None:
        """The next header block, or None at a clean end (end-of-archive or ``end``).

        ``first`` is the offset of the extended header this block must complete, if any.
        """
        if not self.src.fill(BLOCK):
            if len(self.src.buf) - self.src.pos:
                why, at = "truncated: partial tar header at the end of the data", off
            elif first is not None:
                why, at = "truncated: the data ends after an extended header", first
            elif self.src.end is None:
                why, at = "truncated: the data ends without an end-of-archive marker", off
            else:
                why, at = f"truncated: the data ends at byte {off}, before byte {self.src.end}", off
            raise self._error(why, at)
        p = self.src.pos
        hdr = self.src.buf[p : p + BLOCK]
        self.src.pos = p + BLOCK
        if hdr == ZERO_BLOCK:
            if first is not None:
                raise self._error("end-of-archive right after an extended header", first)
            if self.src.end is None:
                self._after_zero_block(off)
                self.src.finish()
            self.src.end_offset = off
            return None
        return hdr

    def _after_zero_block(self, off: int) -> None:
        """The end-of-archive marker is two zero blocks; one, then the end of the data (or
        zeros), is taken too, as tarfile and GNU tar take it. One followed by anything else
        is a zeroed block inside the shard, not its end."""
        self.src.fill(BLOCK)
        rest = self.src.buf[self.src.pos : self.src.pos + BLOCK]
        if rest.count(0) != len(rest):
            raise self._error(
                "one zero block, then more data: a zeroed block inside the shard, "
                "not an end-of-archive marker",
                off,
            )
        self.src.pos += len(rest)

    def _size_of(self, hdr: bytes, off: int) -> int:
        if not checksum_ok(hdr):
            raise self._error("not a tar header (bad header checksum)", off)
        try:
            return parse_number(hdr[124:136])
        except ValueError:
            raise self._error(f"bad size field {bytes(hdr[124:136])!r}", off) from None

    def _extended(self, typeflag: bytes, size: int, off: int, first: int, ext: Extended) -> None:
        """Read an extended header (pax ``x``/``X``/``g``, GNU ``L``/``K``) at ``off`` into
        ``ext``, for the member whose headers start at ``first``."""
        if size > _MAX_META:
            raise self._error(f"extended header of {size} bytes is too large", off)
        data = self.src.member_data(size, off, "<extended header>")
        try:
            if typeflag in (b"x", b"X"):
                ext.add_pax(parse_pax(data, self.src.url, off))
            elif typeflag in (b"L", b"K"):
                ext.add_long(typeflag, data)
        except ValueError as exc:
            raise self._error(str(exc), first) from None
        if typeflag == b"g":
            records = parse_pax(data, self.src.url, off)
            for key in records:
                if key in _GLOBAL_REFUSED or key.startswith("GNU.sparse."):
                    raise self._error(
                        f"a global pax header sets {key!r}, which would apply to every "
                        "member after it: not read",
                        off,
                    )

    def _facts(
        self, hdr: bytes, typeflag: bytes, size: int, first: int, ext: Extended
    ) -> MemberFacts:
        """The member's name and size from all its headers (one rule: :func:`member_facts`)."""
        try:
            return member_facts(ext, hdr, typeflag, size)
        except ValueError as exc:
            raise self._error(str(exc), first) from None

    def _checked(self, name: str, first: int) -> str:
        problem = name_problem(name)
        if problem is not None:
            raise self._error(f"member {name!r} {problem}", first)
        return name

    def next_member(self) -> tuple[str, bytes | int] | None:
        """The next file member (through any extended headers), or None at the end."""
        ext = Extended()  # the extended headers before the member
        first: int | None = None  # offset of the current member's first (extended) header
        while True:
            off = self.src.base + self.src.pos
            if self.src.end is not None and off >= self.src.end and first is None:
                self.src.end_offset = off
                self._finished()
                return None
            hdr = self._header(off, first)
            if hdr is None:
                self._finished()
                return None
            size = self._size_of(hdr, off)
            if first is None:
                first = off
            typeflag = hdr[156:157]
            if typeflag in _EXTENDED:
                self._extended(typeflag, size, off, first, ext)
                if typeflag == b"g" and first == off:
                    first = None
                continue
            facts = self._facts(hdr, typeflag, size, first, ext)
            if typeflag in _REGULAR:
                item = self._file(hdr, typeflag, facts, first, ext.pax)
                if item is not None:
                    return item
            else:
                self._other(typeflag, facts, first)
            ext, first = Extended(), None

    def _file(
        self, hdr: bytes, typeflag: bytes, facts: MemberFacts, first: int, pax: dict[str, str]
    ) -> tuple[str, bytes | int] | None:
        """A regular or sparse member's name and data; None for an old-style directory."""
        name, size = facts.name, facts.size
        if facts.directory:
            if size:  # tarfile reads these bytes as data, GNU tar skips them, bsdtar not
                raise self._error(
                    f"directory entry {name!r} claims {size} bytes of data, which tar "
                    "readers disagree on",
                    first,
                )
            self._count("directory", first, name)
            return None
        self.src.member_offset = first
        self._checked(name, first)
        if typeflag == b"S" or sparse.is_sparse(pax):
            return name, self._sparse(hdr, typeflag, size, first, name, pax)
        data = self.src.member_data(size, first, name, keep=self.src.keep_data)
        return name, (data if self.src.keep_data else size)

    def _other(self, typeflag: bytes, facts: MemberFacts, first: int) -> None:
        """Pass over a member that is not a file, or refuse it (see the module's list)."""
        name, size = facts.name, facts.size
        if typeflag == b"5":  # no data, whatever its size field says (as every reader)
            self._count("directory", first, name)
            return
        kind = _NO_DATA.get(typeflag) or _METADATA.get(typeflag)
        kind = kind or f"type {typeflag.decode('latin-1')!r}"
        if typeflag not in _METADATA and self.policy != "lenient":
            raise self._error(
                f"member {name!r} is a {kind}; shards hold regular files "
                "(a lenient tar policy skips such members: "
                "IoConfig(limits=ReaderLimits(tar_policy='lenient')), "
                "--tar-policy lenient)",
                first,
            )
        self.src.member_data(size, first, f"<{kind}>", keep=False)
        self._count(kind, first, name)

    @property
    def skipped_members(self) -> int:
        """Members passed over that were not directories (links, devices, FIFOs, unknown
        types under the lenient policy; volume labels, ACLs, dump directories always)."""
        return sum(n for kind, n in self.skipped.items() if kind != "directory")

    def _finished(self) -> None:
        """At the end of the read: one warning naming the shard and how many members it
        skipped (the first of each kind was logged as it was met)."""
        n = self.skipped_members
        if n and not self._told:
            self._told = True
            kinds = ", ".join(f"{c} {k}" for k, c in self.skipped.items() if k != "directory")
            logger.warning(
                "%s: skipped %d members (%s) under the %s tar policy", self.src.url, n, kinds,
                self.policy,
            )  # fmt: skip

    def _count(self, kind: str, at: int, name: str) -> None:
        n = self.skipped.get(kind, 0)
        self.skipped[kind] = n + 1
        if not n and kind != "directory":
            logger.warning(
                "%s: skipped %s member %r at byte %d (%s policy); further ones are counted",
                self.src.url,
                kind,
                name,
                at,
                self.policy,
            )

    def _sparse(
        self, hdr: bytes, typeflag: bytes, size: int, first: int, name: str, pax: dict[str, str]
    ) -> bytes | int:
        """A sparse member's data expanded (or its expanded size, when data is not kept)."""
        try:
            if typeflag == b"S":
                real, entries = parse_number(hdr[483:495]), self._old_gnu_map(hdr, first)
            else:
                real, found = sparse.pax_entries(pax)
                if found is None:  # 1.0: the map is at the start of the data
                    found, used = self._map_in_data(size, first)
                    size -= used
                entries = found
            smap = sparse.make_map(real, entries, size)
        except ValueError as exc:
            raise self._error(f"sparse member {name!r}: bad sparse map: {exc}", first) from None
        if not self.src.keep_data:
            self.src.member_data(size, first, name, keep=False)
            return smap.size
        if smap.size > self.src.max_member:
            raise self._error(
                f"member {name!r} is {smap.size} bytes (sparse, expanded), over the "
                f"largest-member limit of {self.src.max_member} bytes",
                first,
            )
        return sparse.expand(self.src.member_data(size, first, name), smap)

    def _old_gnu_map(self, hdr: bytes, first: int) -> list[tuple[int, int]]:
        """The map of a type ``S`` header and of the extension blocks after it."""
        entries = sparse.old_gnu_entries(hdr, 386, 4)
        extended = hdr[482]
        while extended:
            if len(entries) > sparse.MAX_ENTRIES:
                raise ValueError(f"the map has more than {sparse.MAX_ENTRIES} entries")
            block = self.src.take(BLOCK, "a sparse map extension block", first)
            entries += sparse.old_gnu_entries(block, 0, 21)
            extended = block[504]
        return entries

    def _map_in_data(self, size: int, first: int) -> tuple[list[tuple[int, int]], int]:
        """The pax 1.0 map at the start of the member's data, read block by block, and the
        bytes (whole blocks) it takes."""
        self.src.check_claim(size, first, "<sparse map>")
        text = b""
        while True:
            if len(text) >= min(size, _MAX_META):
                raise ValueError("the map does not end inside the member")
            text += self.src.take(BLOCK, "a sparse map", first)
            found = sparse.map_text(text)
            if found is not None:
                return found
