"""Sample indexes as a reader uses them: offsets to seek to, and what proves a seek landed.

An index is believed only as far as it is checked. A version 2 or 3 index is bound to its
shard (the blake2b of the shard's checksum, compared with the manifest's) and gives each
sample's signature (key and field names), which the read at that offset compares with the
sample it finds (:mod:`shardkit.read.stream`). A version 1 index has neither: it is read,
with a warning once per index, and the read can only check its sample counts.

With ``index_checksum`` in the manifest the whole index is read once per process through
the (caching) opener and checked against it; without, each lookup is a small ranged read.
A version 3 index also gives each sample's digest (of its bytes): those are used (to
verify one sample without its piece: :meth:`IndexReader.digest`, :meth:`IndexReader.spans`)
only from an index the manifest vouches for by its ``index_checksum``, so that they are as
good as the manifest; from an index read by ranged reads they are not used at all.
"""

from __future__ import annotations

import logging
import struct
from typing import Protocol

import numpy as np

from shardkit._types import ObjectRef, Opener
from shardkit.errors import ChecksumError, ShardFormatError
from shardkit.format.compression import compressed_name
from shardkit.format.tario.index import (
    SampleIndex,
    index_entry_range,
    index_header_size,
    index_size,
    index_version,
    parse_index,
    shard_binding,
    signature_range,
)

__all__ = ["IndexReader"]

log = logging.getLogger(__name__)
_U64 = struct.Struct("<Q")
_KEEP = 64  # whole indexes kept per process: those of recent shards only


class _Shard(Protocol):
    """What a lookup needs of a shard (a :class:`~shardkit.read.shards.ShardInfo`)."""

    @property
    def ref(self) -> ObjectRef: ...
    @property
    def nsamples(self) -> int: ...
    @property
    def index_url(self) -> str | None: ...
    @property
    def index_checksum(self) -> str | None: ...


class _Head:
    """What the first bytes of an index said: its version and sample count."""

    def __init__(self, version: int, n: int) -> None:
        self.version = version
        self.n = n


class IndexReader:
    """Offsets and signatures of samples, from each shard's index, checked once each."""

    def __init__(self) -> None:
        self._whole: dict[str, SampleIndex] = {}
        self._heads: dict[str, _Head] = {}

    def offset(self, opener: Opener, info: _Shard, i: int) -> int:
        """The byte offset where sample ``i`` starts (``i == nsamples``: the end)."""
        if info.index_checksum is not None:
            idx = self._index(opener, info)
            return _within(info, int(idx.offsets[i]), i, idx.version)
        head = self._head(opener, info)
        at = index_entry_range(i, head.version)[0]
        value = int(_U64.unpack(self._read(opener, _url(info), at, 8))[0])
        return _within(info, value, i, head.version)

    def span(self, opener: Opener, info: _Shard, i: int) -> tuple[int, int, int | None, int | None]:
        """Sample ``i``'s ``(start, end, signature, digest)``: :meth:`offset` of ``i`` and
        ``i + 1``, :meth:`signature` and :meth:`digest`, from one look at the index."""
        if info.index_checksum is None:
            lo, hi = self.offset(opener, info, i), self.offset(opener, info, i + 1)
            return lo, hi, self.signature(opener, info, i), None
        idx = self._index(opener, info)
        offsets = idx.offsets  # increasing (parse_index): the end is the one to check
        end = _within(info, int(offsets[i + 1]), i + 1, idx.version)
        sig = None if idx.signatures is None else int(idx.signatures[i])
        digest = None if idx.digests is None else int(idx.digests[i])
        return int(offsets[i]), end, sig, digest

    def digest(self, opener: Opener, info: _Shard, i: int) -> int | None:
        """Sample ``i``'s digest (of its bytes ``[offset(i), offset(i + 1))``), or None
        where there is none to trust: an index the manifest gives no ``index_checksum``
        for, or one written before version 3."""
        if info.index_checksum is None:
            return None
        digests = self._index(opener, info).digests
        return None if digests is None else int(digests[i])

    def spans(
        self, opener: Opener, info: _Shard
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A shard's per-sample ``(offsets, sizes, digests)`` (three arrays of ``nsamples``;
        :meth:`~shardkit.format.tario.index.SampleIndex.sample_spans`), from an index the
        manifest vouches for (``index_checksum``, checked here, and bound to the shard), or
        None where there are none to trust (no ``index_checksum``, or an index before
        version 3): then verify by the shard's pieces or checksum. Sample ``i`` is the
        bytes ``[offsets[i], offsets[i] + sizes[i])`` of the (decompressed) tar and
        :func:`~shardkit.format.tario.index.sample_digest` of them must be ``digests[i]``
        (:func:`~shardkit.format.tario.index.check_sample` raises naming shard and sample)."""
        if info.index_checksum is None:
            return None
        return self._index(opener, info).sample_spans()

    def signature(self, opener: Opener, info: _Shard, i: int) -> int | None:
        """Sample ``i``'s signature (key and fields), or None for a version 1 index."""
        if info.index_checksum is not None:
            sigs = self._index(opener, info).signatures
            return None if sigs is None else int(sigs[i])
        head = self._head(opener, info)
        if head.version == 1:
            return None
        lo, _ = signature_range(i, head.n)
        return int(_U64.unpack(self._read(opener, _url(info), lo, 8))[0])

    # -- whole indexes (with a checksum in the manifest) --------------------------------
    def _index(self, opener: Opener, info: _Shard) -> SampleIndex:
        url = _url(info)
        idx = self._whole.get(url)
        if idx is not None:
            return idx
        n = info.nsamples
        data = b""
        for version in (3, 2, 1):  # the size the cache stores it under: the newest first
            try:
                data = self._fetch(opener, url, index_size(version, n), info.index_checksum)
                break
            except ChecksumError as exc:
                if version == 1:  # the last size tried says nothing: name what is wrong
                    raise ChecksumError(
                        f"sample index is not the one the manifest vouches for (index_checksum "
                        f"{info.index_checksum}, an index of {n} samples): it was replaced or "
                        "damaged; rewrite it with `shardkit manifest from-shards`",
                        url=url,
                    ) from exc
        idx = parse_index(data, url=url)
        _check_count(url, len(idx.offsets) - 1, n)
        _check_binding(url, info, idx.shard)
        if len(self._whole) >= _KEEP:
            self._whole.pop(next(iter(self._whole)))
        self._whole[url] = idx
        return idx

    @staticmethod
    def _fetch(opener: Opener, url: str, size: int, checksum: str | None) -> bytes:
        with opener.open(ObjectRef(url, size, checksum)) as f:
            return f.read()

    # -- ranged lookups (no checksum: nothing to cache it under) ------------------------
    def _head(self, opener: Opener, info: _Shard) -> _Head:
        url = _url(info)
        head = self._heads.get(url)
        if head is not None:
            return head
        data = opener.read(url, start=0, end=index_header_size(2))
        version = index_version(data[:8])
        if version is None or len(data) < 16:
            raise ShardFormatError("not a shardkit sample index", url=url, offset=0)
        if len(data) < index_header_size(version):
            raise ShardFormatError("sample index is truncated", url=url, offset=len(data))
        n = int(_U64.unpack_from(data, 8)[0])
        _check_count(url, n, info.nsamples)
        _check_binding(url, info, data[16:48] if version >= 2 else None)
        head = self._heads[url] = _Head(version, n)
        return head

    @staticmethod
    def _read(opener: Opener, url: str, lo: int, n: int) -> bytes:
        data = opener.read(url, start=lo, end=lo + n)
        if len(data) != n:
            raise ShardFormatError("sample index is truncated", url=url, offset=lo)
        return data


def _url(info: _Shard) -> str:
    assert info.index_url is not None
    return info.index_url


def _within(info: _Shard, value: int, i: int, version: int) -> int:
    """``value`` (offset ``i`` of the index), unless it points past the shard's end."""
    size = info.ref.size
    if size is not None and value > size and not compressed_name(info.ref.url):
        raise ShardFormatError(
            f"sample index points at byte {value}, past the shard's {size} bytes",
            url=_url(info),
            offset=index_entry_range(i, version)[0],
        )
    return value


def _check_count(url: str, n: int, nsamples: int) -> None:
    if n != nsamples:
        raise ShardFormatError(
            f"sample index lists {n} samples, the manifest says {nsamples}", url=url, offset=8
        )


_warned: set[str] = set()


def _check_binding(url: str, info: _Shard, binding: bytes | None) -> None:
    """A version 2 or 3 index must be the one written for this shard (its checksum)."""
    if binding is None:
        if url not in _warned:
            _warned.add(url)
            log.warning(
                "%s is a version 1 sample index: a seek to its offsets cannot be checked "
                "against the samples found there; rewrite it with `shardkit manifest "
                "from-shards`",
                url,
            )
        return
    checksum = info.ref.checksum
    if checksum is not None and binding != shard_binding(checksum):
        raise ShardFormatError(
            f"sample index belongs to another shard, not {info.ref.url} ({checksum}); "
            "rewrite it with `shardkit manifest from-shards`",
            url=url,
            offset=16,
        )
