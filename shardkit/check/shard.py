"""Check one shard of a manifest: :func:`verify_shard` at a level of
:data:`shardkit.check.verify.LEVELS`.

``quick``: it exists and has its size; ``checksum``: size and checksum of every byte, and
its sample index file (:func:`~shardkit.check.index_file.check_index_file`);
``deep``: also parse it with the tar reader (its sample count, its ``.idx`` sample index,
hostile or broken members), reading through a tee that hashes what passes, so parsing
costs no second read; ``decode``: also decode its fields. The shard is read through the
io seam (an :class:`~shardkit._types.Opener`). Each problem names the shard, what is
wrong, and the expected and found values.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from shardkit._types import ObjectRef
from shardkit.check.decoded import bad_fields
from shardkit.check.index_file import check_index_file, check_vouched, read_index_file
from shardkit.check.report import Problem
from shardkit.check.scan import DigestingReader
from shardkit.errors import FetchError, ShardFormatError, ShardkitError
from shardkit.format.checksum import split_checksum
from shardkit.format.compression import open_tar
from shardkit.format.digest import Digest, HashingReader
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.tario.buffer import skip_bytes, stream_size
from shardkit.format.tario.index import (
    SampleDigester,
    SampleIndex,
    parse_index,
    sample_signature,
    shard_binding,
)
from shardkit.format.tario.reader import TarReader
from shardkit.urls import check_within

if TYPE_CHECKING:
    from shardkit._types import Opener

__all__ = ["CHUNK", "Progress", "verify_shard"]

CHUNK = 8 << 20  # hashlib releases the GIL on big buffers; 8 MB amortises each call
Progress = Callable[[int], object]


_local = threading.local()


def _buffer() -> bytearray:
    """This thread's reusable read buffer."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(CHUNK)
    return buf


def _open_problem(url: str, exc: BaseException) -> Problem:
    cause = exc.__cause__
    missing = isinstance(cause, FileNotFoundError) or (
        isinstance(exc, FetchError) and exc.status in (404, 410)
    )
    if missing:
        return Problem(url, "missing", "shard is missing")
    return Problem(url, "unreadable", f"cannot read: {exc}")


def _probe_size(opener: Opener, url: str, expected: int) -> int | str:
    """Size check by a ranged read around ``expected``: the size, or how it differs."""
    lo = max(expected - 1, 0)
    try:
        got = len(opener.read(url, start=lo, end=expected + 1))
    except FetchError as exc:
        if exc.status == 416:  # the range starts past the end
            return f"< {expected}"
        raise
    want = 1 if expected else 0
    if got == want:
        return expected
    return f"< {expected}" if got < want else f"> {expected}"


def _check_quick(
    entry: ShardEntry, url: str, opener: Opener, progress: Progress | None
) -> int | str:
    with opener.open(ObjectRef(url)) as f:
        size: int | str | None = stream_size(f)
    if size is None:
        size = _probe_size(opener, url, entry.size)
    if progress is not None:
        progress(entry.size)
    return size


def _digest(algo: str, progress: Progress | None, entry: ShardEntry) -> Digest:
    return Digest(algo, entry.pieces.size if entry.pieces is not None else None, progress)


def _check_pieces(entry: ShardEntry, tee: HashingReader) -> list[Problem]:
    """The manifest's piece checksums against the bytes read: the first piece that differs."""
    if entry.pieces is None or tee.digest.pieces is None or tee.digest.size != entry.size:
        return []  # a size problem says it already
    found = tee.digest.pieces.result()
    for k, (want, got) in enumerate(zip(entry.pieces.digests, found.digests, strict=True)):
        if want != got:
            lo, hi = entry.pieces.span(k, entry.size)
            msg = f"piece {k} (bytes {lo}..{hi}) differs from the manifest's piece checksum"
            return [Problem(entry.url, "pieces", msg, want, got, offset=lo)]
    return []


def _check_bytes(
    entry: ShardEntry, url: str, opener: Opener, progress: Progress | None
) -> tuple[int, str, list[Problem]]:
    """Hash the whole shard in big chunks; ``(size, "algo:hex", piece problems)``."""
    algo = split_checksum(entry.checksum)[0]
    buf = _buffer()
    with opener.open(ObjectRef(url)) as f:
        tee = HashingReader(f, _digest(algo, progress, entry))
        tee.drain(buf)
    return tee.digest.size, tee.digest.checksum(), _check_pieces(entry, tee)


def _check_deep(
    manifest: Manifest, entry: ShardEntry, url: str, opener: Opener, how: _How
) -> tuple[int, str, list[Problem]]:
    """Parse and hash in one pass; return ``(size, checksum, parse problems)``."""
    algo = split_checksum(entry.checksum)[0]
    problems: list[Problem] = []
    buf = _buffer()
    with opener.open(ObjectRef(url)) as f:
        size = stream_size(f)
        tee = HashingReader(f, _digest(algo, how.progress, entry))
        offsets: list[tuple[int, int]] = []
        end: int | None = None
        digests: list[int] | None = None
        try:
            with open_tar(tee, url=entry.url) as (tar, kind):  # type: ignore[arg-type]
                offsets, end, digests = _scan(tar, entry.url, size if kind is None else None, how)
        except ShardFormatError as exc:
            if isinstance(exc.__cause__, OSError):  # the bytes could not be read at all
                raise exc.__cause__ from exc
            offset = getattr(exc, "offset", None)
            problems.append(Problem(entry.url, "format", str(exc), offset=offset))
        tee.drain(buf)
    problems.extend(_check_pieces(entry, tee))
    if not problems:
        problems.extend(_check_samples(manifest, entry, (opener, url), offsets, end, digests))
    return tee.digest.size, tee.digest.checksum(), problems


def _check_decoded(entry: ShardEntry, url: str, opener: Opener, how: _How) -> list[Problem]:
    """``decode``: every image, npy, json and text field decodes (a second read)."""
    with opener.open(ObjectRef(url)) as f:
        bad = bad_fields(f, entry.url, stream_size(f), tar_policy=how.tar_policy)
        return [
            Problem(entry.url, "decode", f"sample {key!r} field {name!r}: {why}", offset=off)
            for off, key, name, why in bad
        ]


def _scan(
    f: BinaryIO, url: str, size: int | None, how: _How
) -> tuple[list[tuple[int, int]], int | None, list[int] | None]:
    """Read every sample of a tar stream: each one's ``(offset, signature)``, the end and
    each sample's digest (None where one was too large to hold); members the tar policy
    skips are noted in ``how.skipped``."""
    tee = DigestingReader(f)
    reader = TarReader(tee, url=url, size=size, keep_data=False, policy=how.tar_policy)  # type: ignore[arg-type]
    found = []
    for off, s in reader.samples():
        tee.start(off)
        found.append((off, sample_signature(str(s["__key__"]), [k for k in s if k != "__key__"])))
    end = reader.end_offset
    if end is not None:
        tee.start(end)
    if reader.skipped_members:
        how.skipped[url] = {k: n for k, n in reader.skipped.items() if k != "directory"}
    return found, end, tee.digests if end is not None else None


def _check_samples(
    manifest: Manifest,
    entry: ShardEntry,
    source: tuple[Opener, str],
    found: Sequence[tuple[int, int]],
    end: int | None,
    digests: Sequence[int] | None = None,
) -> list[Problem]:
    """Sample count and sample index against what the parse found (and each sample's
    ``digests``, where the scan made them; else read again by the index's offsets). The
    shard is read from ``source`` (the opener, its url)."""
    opener = source[0]
    offsets = [off for off, _ in found]
    out: list[Problem] = []
    if len(offsets) != entry.nsamples:
        out.append(
            Problem(entry.url, "nsamples", "sample count differs", entry.nsamples, len(offsets))
        )
    if entry.index is None or end is None:
        return out
    try:
        index_url = manifest.resolve(entry.index)
        check_within(index_url, manifest.base)
        data = read_index_file(opener, index_url, entry.nsamples)
        parsed = parse_index(data, url=entry.index)
        index = parsed.offsets
    except (ShardkitError, OSError) as exc:
        out.append(Problem(entry.url, "index", f"sample index {entry.index}: {exc}"))
        return out
    real = [*offsets, end]
    if len(index) != len(real):
        out.append(
            Problem(
                entry.url,
                "index",
                "sample index has a different count",
                len(real) - 1,
                len(index) - 1,
            )
        )
        return out
    for i, (want, got) in enumerate(zip(real, index.tolist(), strict=True)):
        if want != got:
            what = "the end offset" if i == len(offsets) else f"the offset of sample {i}"
            out.append(Problem(entry.url, "index", f"sample index: {what} differs", want, got))
            return out
    bound = _check_bound(entry, parsed, [sig for _, sig in found], digests)
    if bound is None and digests is None and parsed.digests is not None:
        bound = _check_digests_by_offsets(entry, source, parsed)
    if bound is None:  # right for the shard, but readers refuse it (a lookup) or pass it over
        bound = check_vouched(entry, data)
    return out + ([bound] if bound is not None else [])


def _check_digests_by_offsets(
    entry: ShardEntry, source: tuple[Opener, str], index: SampleIndex
) -> Problem | None:
    """Each sample's digest in ``index`` against its bytes, read again and hashed as they
    pass by the index's offsets (the scan holds no sample over 64 MiB to digest it)."""
    assert index.digests is not None
    opener, url = source
    bounds = index.offsets.tolist()
    with opener.open(ObjectRef(url)) as f, open_tar(f, url=entry.url) as (tar, _):
        if skip_bytes(tar, bounds[0]) < bounds[0]:
            return None  # the shard ends early: the scan said so
        pos, k, h = bounds[0], 0, SampleDigester()
        while k < len(bounds) - 1:
            data = tar.read(min(CHUNK, bounds[-1] - pos))
            if not data:
                return None  # the shard ends early: the scan said so
            view, at = memoryview(data), 0
            while at < len(data):
                take = min(len(data) - at, bounds[k + 1] - pos)
                h.update(view[at : at + take])
                at, pos = at + take, pos + take
                if pos == bounds[k + 1]:
                    if h.digest() != int(index.digests[k]):
                        return _digest_differs(entry.url, k)
                    k, h = k + 1, SampleDigester()
    return None


def _digest_differs(url: str, i: int) -> Problem:
    return Problem(url, "index", f"sample index: the digest of sample {i} differs from its bytes")


def _check_bound(
    entry: ShardEntry, index: SampleIndex, sigs: Sequence[int], digests: Sequence[int] | None
) -> Problem | None:
    """A version 2 or 3 index: written for this shard, each sample's key and fields as
    found, and (version 3) each sample's digest that of its bytes (``digests``, None where
    the scan could not hold a sample to digest it)."""
    if index.shard is None or index.signatures is None:
        return None
    if index.shard != shard_binding(entry.checksum):
        return Problem(entry.url, "index", "sample index belongs to another shard")
    for i, (want, got) in enumerate(zip(sigs, index.signatures.tolist(), strict=True)):
        if want != got:
            return Problem(
                entry.url, "index", f"sample index: the key or fields of sample {i} differ"
            )
    if index.digests is None or digests is None:
        return None
    for i, (want, got) in enumerate(zip(digests, index.digests.tolist(), strict=True)):
        if want != got:
            return _digest_differs(entry.url, i)
    return None


@dataclass
class _How:
    """How a shard is parsed: the progress callback, the tar policy, and where the
    members it skips are noted (shard url -> kind -> count)."""

    progress: Progress | None = None
    tar_policy: str = "strict"
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)


def verify_shard(
    manifest: Manifest,
    entry: ShardEntry,
    *,
    level: str = "checksum",
    opener: Opener,
    progress: Progress | None = None,
    within: Callable[[str], None] | None = None,
    tar_policy: str = "strict",
    skipped: dict[str, dict[str, int]] | None = None,
) -> list[Problem]:
    """Check one shard at ``level``; return its problems (empty when it is good).

    ``within`` checks that a local shard's real path lies in the manifest's base
    (default :func:`check_within`; :func:`verify` passes one that remembers directories).
    ``tar_policy`` is the tar reader's (``"lenient"`` skips links, devices, FIFOs and
    unknown member types); the members a deep parse skipped are noted in ``skipped``
    (shard url -> kind -> count) when given.
    """
    how = _How(progress, tar_policy, {} if skipped is None else skipped)
    if within is None:  # a symbolic link may not lead out of the base
        within = functools.partial(check_within, base=manifest.base)
    try:
        url = manifest.resolve(entry.url)
        within(url)
    except ShardkitError as exc:
        return [Problem(entry.url, "url", str(exc))]
    problems: list[Problem] = []
    try:
        if level == "quick":
            size: int | str = _check_quick(entry, url, opener, progress)
            checksum = None
        elif level in ("deep", "decode"):
            size, checksum, problems = _check_deep(manifest, entry, url, opener, how)
            if level == "decode" and not problems and checksum == entry.checksum.lower():
                problems = _check_decoded(entry, url, opener, how)
        else:
            size, checksum, problems = _check_bytes(entry, url, opener, progress)
            bad_index = check_index_file(manifest, entry, opener, within)
            problems += [bad_index] if bad_index is not None else []
    except (OSError, ShardkitError) as exc:  # FetchError, or a CacheError of the io below
        return [_open_problem(entry.url, exc)]
    head: list[Problem] = []
    if size != entry.size:
        head.append(Problem(entry.url, "size", "size differs", entry.size, size))
    if checksum is not None and checksum != entry.checksum.lower():
        # the shard is corrupt, not the manifest's pieces: the offset of its first bad piece
        bad = next((p for p in problems if p.kind == "pieces"), None)
        if bad is not None:
            problems.remove(bad)
        offset = bad.offset if bad is not None else None
        head.append(
            Problem(entry.url, "checksum", "checksum differs", entry.checksum, checksum, offset)
        )
    return head + problems
