"""``cache_verify="open"``: a cached shard hashed again at every open, through the dataset,
against a real Range server; a byte flipped on disk is caught, evicted and fetched again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardkit.cache import CacheKey, CacheStore
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig
from shardkit.streaming.dataset import ShardDataset
from tests.helpers.published import wait_published
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


@pytest.fixture(params=["16KB", None], ids=["pieces", "whole"])
def shards(request: pytest.FixtureRequest, make_shards: Callable[..., Manifest]) -> Manifest:
    if request.param is None:  # an older manifest: no piece checksums
        return make_shards([10] * 4, tokens=3000, subdir="ds", piece_size=None)
    return make_shards([10] * 4, tokens=3000, subdir="ds", piece_size=request.param)


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shards.base)) as srv:
        yield srv


def read(url: str, cache: Path, verify: str) -> tuple[list[str], dict[str, float]]:
    io = IoConfig(cache=CacheConfig(cache_dir=str(cache), cache_verify=verify))
    ds = ShardDataset(url, seed=1, shardshuffle=False, io=io)
    keys = [str(s["__key__"]) for s in ds]
    return keys, ds.io_stats()


def flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_byte_rotted_on_disk_is_caught_at_open_evicted_and_fetched_again(
    shards: Manifest, server: RangeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    url = server.url("manifest.json")
    want, _ = read(url, cache, "fill")
    entry = shards.shards[2]
    path = CacheStore(str(cache)).path(CacheKey.of(entry.checksum, entry.size))
    flip(path, entry.size // 2)  # mid-shard: a reader of the pieces before it starts at once
    server.clear_log()
    got, stats = read(url, cache, "fill")  # by default a hit is not hashed again
    assert got == want and server.requests("/data-*.tar") == []
    assert "cache_rotten" not in stats
    flip(path, entry.size // 2)  # put it back, then rot another byte (in a header)
    flip(path, entry.size - 5000)
    with caplog.at_level(logging.WARNING):
        got, stats = read(url, cache, "open")
    assert got == want  # every sample as it should be: the rotten bytes never reached it
    assert stats["cache_rotten"] == 1 and stats["cache_hits"] == 4
    assert f"{entry.url}: the cached copy rotted on disk" in caplog.text
    fetched = server.requests("/data-*.tar")
    assert {r.path for r in fetched} == {"/" + entry.url}  # that shard only, fetched again
    wait_published(cache, [entry])  # its fill publishes it once the pieces before the rot are in
    with open(path, "rb") as f:
        assert f.read() == (Path(str(shards.base)) / entry.url).read_bytes()
    server.clear_log()
    got, stats = read(url, cache, "open")  # clean now: hashed, nothing fetched
    assert got == want and "cache_rotten" not in stats
    assert server.requests("/data-*.tar") == []
    assert [p.name for p in (cache / "tmp").iterdir()] == []


def test_cache_verify_is_checked() -> None:
    with pytest.raises(ConfigError, match="cache_verify"):
        IoConfig(cache=CacheConfig(cache_verify="always"))
    assert IoConfig().cache.cache_verify == "fill"
    assert IoConfig(cache=CacheConfig(cache_dir="c", cache_verify="open")).cache.cache_dir == "c"
