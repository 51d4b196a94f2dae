"""The tar reader's fast path over extended headers: a pax (``x``) or GNU long-name
(``L``) header before a plain regular member, parsed inline from the reader's buffer when
its records are simple, else left (nothing consumed) to the general member path
(:class:`~shardkit.format.tario.members.MemberReader`), which names every error."""

from __future__ import annotations

from shardkit.format.tario.buffer import Buffered
from shardkit.format.tario.headers import BLOCK, octal_field, plain_header, sum_matches
from shardkit.format.tario.names import fast_name

__all__ = ["FastExtended"]

_FAST_META = 4 * BLOCK  # larger extended headers take the general path
# pax records that change nothing about a member as the reader hands it out
_PAX_IGNORED = frozenset((b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"))


class FastExtended:
    """The fast path of one reader over its byte layer ``src``; it remembers the last
    extended header blocks it checked (``tarfile`` writes the same block before every member
    whose records have the same length)."""

    def __init__(self, src: Buffered) -> None:
        self.src = src
        # the last extended header blocks checked, and the sizes they give
        self._seen: list[tuple[bytes, int, bytes]] = []

    def take(self, buf: bytes, p: int, gnu: bool) -> tuple[str, bytes | int] | None:
        """A pax (``x``) or GNU long-name (``L``) header at ``p`` and the plain regular member
        after it: ``(name, data)``, or None when in doubt (nothing is consumed then).

        Only records that change nothing here (times, owners) or that are simple (``path``,
        ``size`` in ASCII digits) are taken; anything else, and every malformed byte, is
        left to :meth:`MemberReader.next_member`, which names the error. A block equal to
        one of the last few checked is not checked again. Member data that is not all in
        the buffer yet is read as the general path reads it.
        """
        src = self.src
        n = len(buf)
        for seen in self._seen:
            if buf.startswith(seen[0], p):
                break
        else:
            checked = self._check(buf, p)
            if checked is None:
                return None
            seen = checked
        esize = seen[1]
        a = p + BLOCK  # the records
        q = a + esize + (-esize) % BLOCK  # the regular member's header
        if q + BLOCK > n:
            return None
        name: bytes | None = None
        psize: int | None = None
        if gnu:
            name = buf[a : a + esize].partition(b"\0")[0]
        else:
            k = a + len(seen[2])  # the common case: one record whose keyword changes nothing
            eq = buf.find(b"=", k, a + esize)
            if not (
                buf.startswith(seen[2], a)
                and buf[a + esize - 1] == 10
                and eq > k
                and buf[k:eq] in _PAX_IGNORED
            ):
                rec = _simple_pax(buf[a : a + esize])
                if rec is None:
                    return None
                name, psize = rec
        plain = plain_header(buf, q)
        if plain is None or plain[0].endswith(b"/"):
            return None  # a header name ending in "/": tarfile may take it for a directory
        if name is None:
            if plain[2]:  # a ustar prefix: the general path joins it
                return None
            name = plain[0]
        text = fast_name(name)
        if text is None:
            return None
        size = plain[1] if psize is None else psize
        keep = src.keep_data
        src.member_offset = first = src.base + p
        stop = q + BLOCK + size
        if stop + (-size) % BLOCK <= n and (not keep or size <= src.max_member):
            src.pos = stop + (-size) % BLOCK
            return text, buf[q + BLOCK : stop] if keep else size
        src.pos = q + BLOCK  # the data runs past the buffer: read it as the general path does
        data = src.member_data(size, first, text, keep=keep)
        return text, (data if keep else size)

    def _check(self, buf: bytes, p: int) -> tuple[bytes, int, bytes] | None:
        """Check the extended header block at ``p``; remember it with its record size and
        the length prefix of a record that fills it (``b"28 "``), or None when in doubt."""
        hdr = buf[p : p + BLOCK]
        sizef, chkf = hdr[124:136], hdr[148:156]
        if not (octal_field(sizef, 11) and octal_field(chkf, 6) and sum_matches(hdr, chkf)):
            return None
        esize = int(sizef[:11], 8)
        if esize > _FAST_META:
            return None
        seen = (hdr, esize, b"%d " % esize)
        self._seen = [seen, *self._seen[:3]]
        return seen


def _simple_pax(data: bytes) -> tuple[bytes | None, int | None] | None:
    """``(path, size)`` from well-formed pax records that the fast path may take, or None."""
    path = size = None
    pos, n = 0, len(data)
    while pos < n:
        sp = data.find(b" ", pos, pos + 21)
        if sp <= pos or not data[pos:sp].isdigit():
            return None
        stop = pos + int(data[pos:sp])
        if stop > n or stop <= sp + 1 or data[stop - 1] != 10:
            return None
        eq = data.find(b"=", sp + 1, stop)
        if eq <= sp + 1:
            return None
        k = data[sp + 1 : eq]
        if k == b"path":
            path = data[eq + 1 : stop - 1]
        elif k == b"size":
            digits = data[eq + 1 : stop - 1]
            if not digits.isdigit() or len(digits) > 18:
                return None
            size = int(digits)
        elif k not in _PAX_IGNORED:
            return None
        pos = stop
    return path, size
