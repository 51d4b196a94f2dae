"""Issue 19 findings 1 and 2: what a cache file is verified against, and a fill that writes
only what it asked for. Real Range servers on 127.0.0.1, real processes, the data set and
loader with workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, make_opener, opener_for
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIECE = 32_000


def keys_and_tokens(samples: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(str(s["__key__"]), bytes(s["tokens.npy"])) for s in samples]


def loader_samples(manifest_url: str, cache: str) -> list[tuple[str, bytes]]:
    """Every sample of the data set, read by ShardDataset + WebLoader with 2 workers."""
    from shardkit.streaming.dataset import ShardDataset
    from shardkit.streaming.loader import WebLoader

    ds = ShardDataset(manifest_url, cache_dir=cache)
    got = keys_and_tokens(list(WebLoader(ds, num_workers=2)))
    return sorted(got)


@pytest.fixture
def twins(make_shards: Callable[..., Manifest], tmp_path: Path) -> tuple[Manifest, Manifest]:
    """Two data sets of the same shape (equal shard sizes), other bytes; then ``b`` gets a
    hostile manifest: ``a``'s checksums over ``b``'s bytes and ``b``'s piece table."""
    a = make_shards([10, 10], tokens=3000, subdir="a", piece_size=PIECE)
    b = make_shards([10, 10], tokens=3000, subdir="b", piece_size=PIECE, seed=1)
    assert [s.size for s in a.shards] == [s.size for s in b.shards]
    doc = json.loads((tmp_path / "b" / "manifest.json").read_text())
    for entry, other in zip(doc["shards"], a.shards, strict=True):
        entry["checksum"] = other.checksum
    (tmp_path / "b" / "hostile.json").write_text(json.dumps(doc))
    return a, b


def test_pieces_of_other_bytes_are_a_checksum_error_for_every_reader(
    twins: tuple[Manifest, Manifest], tmp_path: Path
) -> None:
    a, _ = twins
    cache = str(tmp_path / "cache")
    with RangeServer(tmp_path) as srv:
        url = srv.url("b/hostile.json")
        opener = make_opener(cache_dir=cache)
        m = load_manifest(url, opener)
        for _ in range(2):  # the reader that fills, then one that finds the verdict
            with pytest.raises(ChecksumError, match="pieces listed are not this shard"):
                read_samples(m, opener)
        with pytest.raises(ChecksumError):
            loader_samples(url, cache)
    store = CacheStore(cache)
    for s in a.shards:  # never published under a's checksum
        assert not os.path.exists(store.path(CacheKey.of(s.checksum, s.size)))


def hostile_main(argv: list[str]) -> None:
    """Job B: open its first shard through the cache, take one piece, die (SIGKILL)."""
    manifest_url, cache = argv
    # a request per piece (range_size): piece 0 is in long before the rest
    cfg = IoConfig(range_size=PIECE, cache=CacheConfig(cache_dir=cache, piece_parallel=1))
    opener = opener_for(cfg)
    m = load_manifest(manifest_url, opener)
    e = m.shards[0]
    with opener.open(ObjectRef(m.resolve(e.url), e.size, e.checksum, e.pieces)) as f:
        f.read(1)  # piece 0 verified against B's piece table, and more on their way
        os.kill(os.getpid(), signal.SIGKILL)


def test_another_jobs_piece_table_never_serves_its_bytes(
    twins: tuple[Manifest, Manifest], tmp_path: Path
) -> None:
    a, _ = twins
    cache = str(tmp_path / "cache")
    with RangeServer(tmp_path, bandwidth=100_000) as srv:
        code = f"import sys; from {__name__} import hostile_main; hostile_main(sys.argv[1:])"
        job_b = subprocess.run(
            [sys.executable, "-c", code, srv.url("b/hostile.json"), cache],
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert job_b.returncode == -signal.SIGKILL
        parts = list(CacheStore(cache).parts())
        assert len(parts) == 1  # B's fill stopped part way, its map kept
        srv.throttle.rate = None
        want = sorted(keys_and_tokens(read_samples(a)))
        assert loader_samples(srv.url("a/manifest.json"), cache) == want
    # A's fill had a temp file of its own: B's, under B's piece table, is still there
    assert parts[0].path in [p.path for p in CacheStore(cache).parts()]


def test_a_206_longer_than_asked_never_overwrites_verified_pieces(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([10], tokens=3000, subdir="ds", piece_size=PIECE)
    e = m.shards[0]
    source = (Path(str(m.base)) / e.url).read_bytes()
    cache = str(tmp_path / "cache")
    store = CacheStore(cache)
    with RangeServer(str(m.base)) as srv:
        # the request for piece 0 comes last (the reader starts at piece 1); its answer
        # runs into piece 1, already verified, with wrong bytes: the part asked is taken
        srv.add_fault("/" + e.url, "long", start=0, after=PIECE // 2)
        opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache, piece_parallel=1)))
        remote = load_manifest(srv.url("manifest.json"), opener)
        url = remote.resolve(e.url)
        with opener.open(ObjectRef(url, e.size, e.checksum, e.pieces), start=PIECE) as f:
            assert f.read() == source[PIECE:]
        assert opener.drain(30)
        with opener.open(ObjectRef(url, e.size, e.checksum, e.pieces)) as f:
            assert f.read() == source
        # the over-long answer was sent, only the part asked kept (the server logs what it
        # sent once its write returns, which may be after the reader took the part it asked)
        deadline = time.monotonic() + 10
        while True:
            asked = [r for r in srv.requests("/" + e.url) if r.range == f"bytes=0-{PIECE - 1}"]
            longs = [r for r in asked if r.sent > PIECE]
            if longs or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert len(asked) == 1 and len(longs) == 1, [
            (r.range, r.sent) for r in srv.requests("/" + e.url)
        ]
    with open(store.path(CacheKey.of(e.checksum, e.size)), "rb") as f:
        assert f.read() == source  # published, whole and right
    assert opener.stats().get("checksum_failures", 0) == 0


def test_a_long_answer_through_the_loader(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([10, 10, 10], tokens=3000, subdir="ds", piece_size=PIECE)
    cache = str(tmp_path / "cache")
    with RangeServer(str(m.base)) as srv:
        for s in m.shards:
            srv.add_fault("/" + s.url, "long", start=PIECE, after=2 * PIECE)
        want = sorted(keys_and_tokens(read_samples(m)))
        assert loader_samples(srv.url("manifest.json"), cache) == want
        assert loader_samples(srv.url("manifest.json"), cache) == want  # from the cache
    store = CacheStore(cache)
    for s in m.shards:
        path = store.path(CacheKey.of(s.checksum, s.size))
        assert Path(path).read_bytes() == (Path(str(m.base)) / s.url).read_bytes()
