"""A 206 whose Content-Range is a superset of the range asked (some servers and CDNs answer
so): the part asked is taken and checked by its piece, the rest dropped, where it used to
fail after its attempts. Against the Range server on 127.0.0.1 answering every range wide."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import make_opener, opener_for
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

PIECE = 16 << 10


def _asked(header: str) -> int:
    lo, hi = header.removeprefix("bytes=").split("-")
    return int(hi) + 1 - int(lo)


@pytest.mark.parametrize("cached", [False, True])
def test_a_superset_206_gives_the_part_asked(
    make_shards: Callable[..., Manifest], tmp_path: Path, cached: bool
) -> None:
    m = make_shards([10, 7], tokens=3000, subdir="ds", piece_size=PIECE)
    e = m.shards[0]
    local = (Path(str(m.base)) / e.url).read_bytes()
    cache = str(tmp_path / "cache") if cached else None
    with RangeServer(str(m.base)) as srv:
        for s in m.shards:  # every range answered 1000 bytes wider on both sides
            srv.add_fault("/" + s.url, "wide", times=1000, at=1000, after=1000)
        opener = opener_for(IoConfig(range_size=PIECE, cache=CacheConfig(cache_dir=cache)))
        remote = load_manifest(srv.url("manifest.json"), opener)
        url = remote.resolve(e.url)
        assert opener.read(url, start=5000, end=9000) == local[5000:9000]  # no checksums
        with opener.open(
            ObjectRef(url, e.size, e.checksum, e.pieces), start=PIECE + 3, end=3 * PIECE
        ) as f:
            assert f.read() == local[PIECE + 3 : 3 * PIECE]
        assert read_samples(remote, opener) == read_samples(m, make_opener())
        # the server did answer every range wide (it logs what it sent once its write
        # returns, which may be after the reader took the part it asked and went on)
        deadline = time.monotonic() + 10
        while True:
            answers = [r for r in srv.requests("/" + e.url) if r.status == 206 and r.range]
            wide = [r for r in answers if r.sent > _asked(str(r.range))]
            if len(wide) == len(answers) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert len(wide) == len(answers) > 2
    assert opener.stats().get("checksum_failures", 0) == 0
