"""Re-verifying a cached shard as it is opened (``IoConfig(cache_verify="open")``): disk rot
is caught before a byte of it reaches a reader.

With pieces in the manifest, the hit is read through
:class:`~shardkit.io.verified.VerifiedFile`, which checks each piece a reader comes to
before handing out any of its bytes, so a reader starts as soon as its own first piece is
checked and a ranged read checks only the pieces it covers. Without pieces the whole shard
is hashed at open (:func:`whole_matches`). A shard that does not match is evicted (renamed
out of ``data/`` if another process still reads it) and named in a warning and the
``cache_rotten`` counter; the reader goes on from a fresh copy, fetched again through the
cache and verified as any fill is.
"""

from __future__ import annotations

import logging
import os

from shardkit.cache.layout import CacheKey
from shardkit.counters import Counters
from shardkit.format.checksum import new_hasher

__all__ = ["report_rot", "whole_matches"]

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


def digest_of(fd: int, hi: int, algo: str, *, start: int = 0) -> str:
    """The digest of the bytes ``[start, hi)`` of the file ``fd``, read through one small
    buffer (a fresh large one per read costs more in page faults than the hash itself)."""
    h = new_hasher(algo)
    view = memoryview(bytearray(_CHUNK))
    pos = start
    while pos < hi:
        n = os.preadv(fd, [view[: min(_CHUNK, hi - pos)]], pos)
        if n == 0:
            break
        h.update(view[:n])
        pos += n
    return h.hexdigest()


def whole_matches(fd: int, key: CacheKey) -> bool:
    """Whether the cached file ``fd`` still matches the checksum it is cached under."""
    return digest_of(fd, key.size, key.algo) == key.digest


def report_rot(counters: Counters, url: str, what: str) -> None:
    counters.add("cache_rotten")
    log.warning("%s: the cached copy rotted on disk (%s); evicted, fetched again", url, what)
