"""The streaming tar reader: the hot path of every read.

:class:`TarReader` is the sample loop over two parts it holds: the byte layer
(:class:`~shardkit.format.tario.buffer.Buffered`) and the general member path
(:class:`~shardkit.format.tario.members.MemberReader`: header parsing and every
hostile-input check). Consecutive members that share a key become one sample, and the
common member shapes are parsed inline from the buffer. Anything unusual goes through the
general path, which names the error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO, NamedTuple, cast

from shardkit._types import Sample
from shardkit.errors import ShardFormatError
from shardkit.format.compression import open_tar
from shardkit.format.tario.buffer import DEFAULT_MAX_MEMBER, Buffered, skip_bytes
from shardkit.format.tario.fast_extended import FastExtended
from shardkit.format.tario.headers import (
    BLOCK,
    plain_member,
)
from shardkit.format.tario.members import MemberReader

__all__ = ["TarReader", "iter_members", "iter_samples", "open_range", "read_shard"]


class TarReader:
    """Iterate the regular members, or the samples, of a tar stream.

    Composed of the byte layer (:class:`~shardkit.format.tario.buffer.Buffered`: large
    reads, slices, unbuffered reads of large members) and the general member path
    (:class:`~shardkit.format.tario.members.MemberReader`: every member kind and check);
    the sample loop here parses the common member shapes inline and falls back to the
    general path for anything else.

    Args:
        f: a binary stream positioned at ``start`` (a member header).
        url: the shard's name, used in error messages.
        start: the absolute byte offset ``f`` is positioned at.
        end: stop before this absolute offset (a sample-range read); None reads to the
            end-of-archive marker (one zero block at least, then zeros or the end).
        size: the stream's total size when known (found with ``fstat`` for plain files);
            a member claiming bytes past it is rejected before anything is read. When
            the size is unknown, reads are bounded pieces, so a false claim costs memory
            only for the bytes really there.
        keep_data: False reads past member data without keeping it (fields come back
            as their size in bytes, an ``int``): a check of the structure, or a count of
            field sizes, that still reads every byte and holds none of it.
        max_member: the largest member (bytes, a sparse one expanded) whose data is kept
            in memory; a larger one is a :class:`ShardFormatError` raised before any of
            its data is read (a 65 KB zstd bomb can claim gigabytes). Not applied when
            ``keep_data`` is off.
        policy: ``"strict"`` (default) refuses links, devices, FIFOs and unknown member
            types; ``"lenient"`` skips them, counted in :attr:`skipped` and logged.

    Errors name the header block at fault: :attr:`ShardFormatError.offset` is the start
    of the (extended) header of the bad or truncated member, of a partial header, or
    where an end-of-archive marker was expected. :attr:`skipped` counts the members passed
    over, by kind (``"directory"``, ``"symbolic link"``, ``"type 'Q'"``, ...).
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
        policy: str = "strict",
    ) -> None:
        src = Buffered(f, url, (start, end), size, max_member if keep_data else None)
        self.src = src
        self.general = MemberReader(src, policy=policy)
        self.fast = FastExtended(src)  # pax and GNU long names before plain members

    @property
    def url(self) -> str:
        return self.src.url

    @property
    def offset(self) -> int:
        """The absolute offset of the next unread byte."""
        return self.src.offset

    @property
    def member_offset(self) -> int:
        """Where the last member (with its extended headers) began."""
        return self.src.member_offset

    @property
    def end_offset(self) -> int | None:
        """The end-of-archive marker (or ``end``), once met."""
        return self.src.end_offset

    @property
    def skipped(self) -> dict[str, int]:
        """The members passed over, by kind."""
        return self.general.skipped

    @property
    def skipped_members(self) -> int:
        """Members passed over that were not directories."""
        return self.general.skipped_members

    def __iter__(self) -> Iterator[tuple[str, bytes | int]]:
        return self.members()

    def members(self) -> Iterator[tuple[str, bytes | int]]:
        """Yield ``(name, data)`` for each regular file; :attr:`member_offset` is its start.

        ``data`` is the member's size (an ``int``) when ``keep_data`` is off.
        """
        while True:
            item = self.general.next_member()
            if item is None:
                return
            yield item

    def samples(self) -> Iterator[tuple[int, Sample]]:
        """Yield ``(byte_offset, sample)``: consecutive members sharing a key, grouped.

        A sample is ``{"__key__": key, field: bytes, ...}``; members whose basename has no
        dot carry no field and are skipped (as WebDataset does). A field twice in one
        sample is a :class:`ShardFormatError`.

        The loop takes the common case itself: a plain ustar regular file with no prefix
        (:func:`~shardkit.format.tario.headers.plain_header`), a name that needs no second
        look (:func:`~shardkit.format.tario.names.fast_name`), and all of it (header, data,
        padding) already in the buffer. Anything else, or any doubt, goes through
        :meth:`MemberReader.next_member`, which names the error.
        A pax or GNU long-name header before a member (``webdataset.ShardWriter`` writes
        one per member, through ``tarfile``) takes :meth:`FastExtended.take` first.
        """
        src = self.src
        current: Sample = {}
        key = None
        sample_offset = src.member_offset
        slow = self.general.next_member
        end = src.end
        keep = src.keep_data
        limit = src.max_member if keep else None
        if end is None or src.offset < end:
            src.fill(BLOCK)  # so that the first member can take the fast path too
        while True:
            buf = src.buf
            p = src.pos
            item: tuple[str, bytes | int] | None = None
            if len(buf) - p >= BLOCK and (end is None or src.base + p < end):
                tf = buf[p + 156]
                if tf == 48 or tf == 0:  # b"0" or NUL: a regular file
                    plain = plain_member(buf, p)  # no ustar prefix to join, a plain name
                    if plain is not None:
                        name, size = plain
                        total = BLOCK + size + (-size) % BLOCK
                        if limit is not None and size > limit:
                            pass  # the general path names the error
                        elif p + total <= len(buf):
                            src.member_offset = src.base + p
                            src.pos = p + total
                            item = (name, buf[p + BLOCK : p + BLOCK + size] if keep else size)
                        else:  # data past the buffer: read as the general path reads it
                            src.member_offset = first = src.base + p
                            src.pos = p + BLOCK
                            got = src.member_data(size, first, name, keep=keep)
                            item = (name, got if keep else size)
                elif tf == 120 or tf == 76:  # b"x" or b"L": a pax or GNU long-name header
                    item = self.fast.take(buf, p, tf == 76)
            if item is None:
                item = slow()
                if item is None:
                    break
            name, data = item
            slash = name.rfind("/")
            dot = name.find(".", slash + 1)
            if dot <= slash + 1:
                continue
            k = name[:dot]
            if k != key:
                if current:
                    yield sample_offset, current
                key = k
                current = {"__key__": k}
                sample_offset = src.member_offset
            field = name[dot + 1 :]
            if field in current:
                raise ShardFormatError(
                    f"sample {k!r} has field {field!r} twice",
                    url=self.url,
                    offset=src.member_offset,
                )
            current[field] = data
        if current:
            yield sample_offset, current


def iter_members(
    f: BinaryIO,
    *,
    url: str = "<stream>",
    start: int = 0,
    end: int | None = None,
    policy: str = "strict",
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, data)`` for each regular file member of a tar stream."""
    reader = TarReader(f, url=url, start=start, end=end, policy=policy)
    return cast(Iterator[tuple[str, bytes]], reader.members())


def iter_samples(
    f: BinaryIO,
    *,
    url: str = "<stream>",
    start: int = 0,
    end: int | None = None,
    size: int | None = None,
    max_member: int = DEFAULT_MAX_MEMBER,
    policy: str = "strict",
) -> Iterator[tuple[int, Sample]]:
    """Yield ``(byte_offset, sample)`` of a tar stream (see :meth:`TarReader.samples`)."""
    reader = TarReader(
        f, url=url, start=start, end=end, size=size, max_member=max_member, policy=policy
    )
    return reader.samples()


def read_shard(
    source: str | os.PathLike[str] | BinaryIO,
    *,
    url: str | None = None,
    start: int = 0,
    end: int | None = None,
    max_member: int = DEFAULT_MAX_MEMBER,
    policy: str = "strict",
) -> Iterator[Sample]:
    """Iterate the samples of a tar shard (a path or a binary stream).

    Each sample is a dict with ``__key__`` and one ``bytes`` value per field. A shard
    compressed whole with zstd or gzip (told by its first bytes, whatever its name) is
    decompressed on the fly. ``start``/``end`` read a byte range (a sample range taken
    from the shard's index; offsets in the decompressed tar for a compressed shard): a
    path is opened there, a stream must already be positioned at ``start`` (and is then
    taken as a plain tar). A member larger than ``max_member`` bytes is a
    :class:`ShardFormatError`. ``policy`` says what links, devices, FIFOs and unknown
    member types do: ``"strict"`` refuses them, ``"lenient"`` skips them with a warning
    (see :class:`~shardkit.format.tario.members.MemberReader`).
    """
    opts = _Options(max_member, policy)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        return _read_path(path, url or path, start, end, opts)
    name = str(url or getattr(source, "name", None) or "<stream>")
    if start:
        samples = iter_samples(
            source, url=name, start=start, end=end, max_member=max_member, policy=policy
        )
        return (s for _, s in samples)
    return _read_stream(source, name, end, opts)


class _Options(NamedTuple):
    max_member: int
    policy: str


def _read_stream(f: BinaryIO, url: str, end: int | None, opts: _Options) -> Iterator[Sample]:
    with open_tar(f, url=url) as (tar, _):
        samples = iter_samples(
            tar, url=url, end=end, max_member=opts.max_member, policy=opts.policy
        )
        yield from (s for _, s in samples)


def _read_path(
    path: str, url: str, start: int, end: int | None, opts: _Options
) -> Iterator[Sample]:
    def open_at(pos: int) -> BinaryIO:
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by open_range
        except OSError as exc:
            raise ShardFormatError(f"cannot open shard: {exc.strerror}", url=url) from exc
        f.seek(pos)
        return f

    with open_range(open_at, url=url, start=start) as (tar, _):
        samples = iter_samples(
            tar, url=url, start=start, end=end, max_member=opts.max_member, policy=opts.policy
        )
        yield from (s for _, s in samples)


@contextmanager
def open_range(
    open_at: Callable[[int], BinaryIO], *, url: str, start: int = 0, packed: bool | None = None
) -> Iterator[tuple[BinaryIO, str | None]]:
    """``(tar stream positioned at start, compression)`` of a maybe-compressed shard.

    ``open_at(pos)`` opens the shard's bytes from byte ``pos``; ``start`` is an offset in
    the tar (in the decompressed tar for a compressed shard). ``packed`` is what the
    shard's name says: False opens a plain tar at ``start`` (a ranged read, told
    nothing by its first bytes unless ``start`` is 0); True, or None (told by the first
    bytes only), reads from byte 0 and decompresses up to ``start``, or seeks there in a
    plain tar whose stream can seek. A stream that can seek stays the tar stream, so the
    reader's unbuffered reads of large members work on every path.
    """
    if packed is False and start:
        with open_at(start) as f:
            yield f, None
        return
    with open_at(0) as f, open_tar(f, url=url) as (tar, kind):
        if start:
            if kind is None and tar.seekable():
                tar.seek(start)
            else:
                skip_bytes(tar, start)
        yield tar, kind
