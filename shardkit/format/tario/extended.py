"""What the extended headers before a member make of it: its name and size, decided once.

Before a member may come pax headers (``x``, Solaris ``X``), GNU long-name and long-link
headers (``L``, ``K``) and global pax headers (``g``). The readers a shard must read alike
in (Python's tarfile, and so webdataset; GNU tar; bsdtar) apply them differently:

- tarfile lets the first header win (each wraps the ones after it); GNU tar and bsdtar take
  the last pax header whole and the last GNU long name, and GNU tar a pax ``path`` over a
  GNU long name in either order;
- tarfile strips a ``/`` from the end of a pax ``path``; GNU tar and bsdtar keep it;
- a size on a link, device or FIFO: tarfile reads no data for it, GNU tar skips that many
  bytes (for a hard link, only a pax size); on a directory, tarfile and GNU tar read none
  and bsdtar skips a pax size; on volume labels, ACLs, dump directories and unknown types
  tarfile and GNU tar skip the size (a pax one, as for a file).

:func:`member_facts` works the member out twice, by tarfile's rules and by GNU tar's, and
reads it where the two agree; where they do not it refuses it (a ``ValueError`` naming
both, which the reader names with the shard and offset): a size or sparse map that differs
(what follows any member), a name that differs (a file: other members are never handed
out, their names in logs and counts are tarfile's, and link targets are never read), a
pax ``size`` on a directory (bsdtar).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardkit.format.tario.headers import ustar_name
from shardkit.format.tario.names import normal_name

__all__ = ["Extended", "MemberFacts", "member_facts"]

# member types tarfile reads no data for, whatever a pax size says
_NO_DATA_TYPES = frozenset((b"1", b"2", b"3", b"4", b"5", b"6"))
_FILE_TYPES = frozenset((b"0", b"\0", b"7", b"S"))
_NAMES = frozenset(("path", "GNU.sparse.name"))  # pax records that name the member


@dataclass
class Extended:
    """The extended headers met before one member, kept as tarfile applies them (the
    first wins) and as GNU tar does (the last pax header whole, the last long name)."""

    pax: dict[str, str] = field(default_factory=dict)  # tarfile's records
    gnu_pax: dict[str, str] = field(default_factory=dict)  # GNU tar's records
    long_name: str | None = None  # tarfile's GNU long name
    gnu_long_name: str | None = None  # GNU tar's
    name_first: bool = False  # a GNU long name came before the first pax name

    def add_pax(self, records: dict[str, str]) -> None:
        """A pax ``x``/``X`` header's records."""
        if not _NAMES.isdisjoint(records) and _NAMES.isdisjoint(self.pax):
            self.name_first = self.long_name is not None
        self.pax = {**records, **self.pax}
        self.gnu_pax = records

    def add_long(self, typeflag: bytes, data: bytes) -> None:
        """A GNU ``L`` (name) or ``K`` (link: never read, links are never handed out)."""
        if typeflag == b"L":
            text = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            self.long_name = text if self.long_name is None else self.long_name
            self.gnu_long_name = text


@dataclass(frozen=True)
class MemberFacts:
    """A member as its headers describe it: its normal ``name``, its ``size`` (the bytes
    after its header that are its data), and whether a file type is an old-style directory
    (type NUL with a header name ending in ``/``, as tarfile and GNU tar tell it, or any
    name ending in ``/``)."""

    name: str
    size: int
    directory: bool = False


def _tarfile_name(ext: Extended, hdr: bytes) -> str:
    """tarfile's: the first of a GNU long name and a pax name; of ``path`` and
    ``GNU.sparse.name``, the later record; a ``path`` without a ``/`` at its end."""
    pax = ext.pax
    path, sparse = pax.get("path"), pax.get("GNU.sparse.name")
    if path is not None:
        path = path.rstrip("/")
    if ext.long_name is not None and (ext.name_first or (path is None and sparse is None)):
        return ext.long_name
    if sparse is not None and path is not None:
        order = list(pax)
        return path if order.index("path") > order.index("GNU.sparse.name") else sparse
    for name in (sparse, path):
        if name is not None:
            return name
    return ustar_name(hdr)


def _gnu_name(ext: Extended, hdr: bytes) -> str:
    """GNU tar's: ``GNU.sparse.name``, else ``path``, else the long name, else the header's."""
    for name in (ext.gnu_pax.get("GNU.sparse.name"), ext.gnu_pax.get("path"), ext.gnu_long_name):
        if name is not None:
            return name
    return ustar_name(hdr)


def _size(pax: dict[str, str], size: int) -> int:
    text = pax.get("size")
    if text is None:
        return size
    if not (text.isascii() and text.isdigit()):
        raise ValueError("pax size is not a number")
    return int(text)


def _data(typeflag: bytes, size: int, pax: dict[str, str], *, gnu: bool) -> int:
    """The bytes after the header that tarfile (or GNU tar) takes as the member's data."""
    n = _size(pax, size)
    if typeflag not in _NO_DATA_TYPES:
        return n
    if not gnu or typeflag == b"5" or (typeflag == b"1" and "size" not in pax):
        return 0  # GNU tar: a hard link's size field means nothing, a pax size does
    return n


def _sparse(pax: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in pax.items() if k.startswith("GNU.sparse.") and k != "GNU.sparse.name"}


def member_facts(ext: Extended, hdr: bytes, typeflag: bytes, size: int) -> MemberFacts:
    """The name and size of the member whose header is ``hdr`` (its size field gave
    ``size``) under the extended headers ``ext``; ValueError where what it hands out
    would depend on the reader. ``size`` in the answer is what follows the header as the
    member's data (0 for a directory, link, device or FIFO)."""
    mine: str | None = None
    name, gnu_name = _tarfile_name(ext, hdr), _gnu_name(ext, hdr)
    # tarfile takes type NUL with a header name ending in "/" for a directory (GNU tar
    # lists it as a file and turns it into a directory only when extracting)
    tar_dir = typeflag == b"\0" and ustar_name(hdr).endswith("/")
    data = _data(b"5" if tar_dir else typeflag, size, ext.pax, gnu=False)
    gnu_data = _data(typeflag, size, ext.gnu_pax, gnu=True)
    kind = f"member {name!r} (type {typeflag.decode('latin-1')!r})"
    if data != gnu_data or _sparse(ext.pax) != _sparse(ext.gnu_pax):
        raise ValueError(
            f"{kind}: tarfile reads {data} bytes of data after its header, GNU tar "
            f"{gnu_data} (or another sparse map): readers disagree"
        )
    if typeflag == b"5" and _size(ext.gnu_pax, 0):  # bsdtar, as GNU tar, takes the last
        raise ValueError(
            f"{kind} has a pax size of {_size(ext.gnu_pax, 0)} bytes: tarfile and GNU tar "
            "read no data for it, bsdtar skips that many bytes"
        )
    if typeflag in _FILE_TYPES:  # a name ending in "/" gives no sample field (None)
        mine = None if tar_dir or name.endswith("/") else name
        if mine != (None if gnu_name.endswith("/") else gnu_name):
            raise ValueError(
                f"a file named {name!r}{' (a directory)' if tar_dir else ''} as tarfile "
                f"applies its extended headers and {gnu_name!r} as GNU tar does"
            )
    return MemberFacts(normal_name(name), data, typeflag in _FILE_TYPES and mine is None)
