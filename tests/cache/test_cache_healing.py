"""Issue 19 findings 8 and 9 (cache parts): the cache heals what changed under it and keeps
its promises. A cached shard whose size changed is evicted and fetched again; an OS error
in a fill thread is a warning and a count, and the read goes on; a ledger edited with
valid checksums cannot let the cache grow past its limit."""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, make_opener, opener_for
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.published import wait_published
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([10] * 4, tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shards.base)) as srv:
        yield srv


def loader_keys(manifest_url: str, cache: str) -> list[str]:
    from shardkit.streaming.dataset import ShardDataset
    from shardkit.streaming.loader import WebLoader

    ds = ShardDataset(manifest_url, cache_dir=cache)
    return sorted(str(s["__key__"]) for s in WebLoader(ds, num_workers=2))


@pytest.mark.parametrize("change", ["cut", "grown"])
def test_a_cached_shard_whose_size_changed_is_fetched_again(
    shards: Manifest, server: RangeServer, tmp_path: Path, change: str
) -> None:
    cache = str(tmp_path / "cache")
    opener = make_opener(cache_dir=cache)
    m = load_manifest(server.url("manifest.json"), opener)
    want = read_samples(shards)
    assert read_samples(m, opener) == want
    wait_published(Path(cache), shards.shards)
    e = shards.shards[1]
    path = CacheStore(cache).path(CacheKey.of(e.checksum, e.size))
    with open(path, "r+b") as f:  # someone changed the cached copy on disk
        if change == "cut":
            f.truncate(e.size - 512)
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * 512)
    server.clear_log()
    for _ in range(2):  # healed once, then a hit again
        fresh = make_opener(cache_dir=cache)
        assert read_samples(m, fresh) == want
    assert len(server.requests("/" + e.url)) == 1  # fetched again, once
    assert fresh.stats().get("cache_hits") == 4
    assert os.path.getsize(path) == e.size
    keys = sorted(str(s["__key__"]) for s in want)
    assert loader_keys(server.url("manifest.json"), cache) == keys


def test_a_fill_threads_os_error_is_a_warning_and_the_read_goes_on(
    make_shards: Callable[..., Manifest], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = make_shards([10], tokens=3000, subdir="pieces", piece_size=32_000)
    e = m.shards[0]
    source = (Path(str(m.base)) / e.url).read_bytes()
    cache = tmp_path / "cache"
    crashed: list[Any] = []
    hook = threading.excepthook
    threading.excepthook = crashed.append
    try:
        with RangeServer(str(m.base), bandwidth=200_000) as srv:
            # a request per piece (range_size): the fill is still on when the dir goes
            cfg = IoConfig(range_size=32_000, cache=CacheConfig(cache_dir=cache, piece_parallel=1))
            opener = opener_for(cfg)
            remote = load_manifest(srv.url("manifest.json"), opener)
            url = remote.resolve(e.url)
            with caplog.at_level(logging.WARNING, logger="shardkit"):
                with opener.open(ObjectRef(url, e.size, e.checksum, e.pieces)) as f:
                    first = f.read(1)
                    # mid-fill, where shards are published becomes unusable (not a dir)
                    (cache / "data" / "sha256").write_bytes(b"")
                    assert first + f.read() == source
                assert opener.drain(30)
    finally:
        threading.excepthook = hook
    assert crashed == []  # no thread died with a traceback
    assert opener.stats()["cache_errors"] >= 1
    assert "cannot publish" in caplog.text


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def test_a_ledger_edited_with_valid_checksums_cannot_exceed_the_limit(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    size = max(s.size for s in shards.shards)
    limit = 2 * (size + 1)
    cache = str(tmp_path / "cache")
    opener = opener_for(
        IoConfig(cache=CacheConfig(cache_dir=cache, cache_limit=limit, prefetch_depth=0))
    )
    m = load_manifest(server.url("manifest.json"), opener)
    urls = [m.resolve(s.url) for s in m.shards]
    for u, s in list(zip(urls, m.shards, strict=True))[:2]:
        assert opener.ensure_cached(ObjectRef(u, s.size, s.checksum, s.pieces)) == "fetched"
    ledger = Path(cache) / "ledger"
    lines = ledger.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0].split(b" ", 1)[1])
    listed = [
        [os.path.relpath(p, cache), 1, p.stat().st_mtime_ns]  # each shard "1 byte"
        for p in (Path(cache) / "data").rglob("*")
        if p.is_file()
    ]
    ledger.write_bytes(_line(header) + _line({"add": listed, "del": []}) + _line({"end": True}))
    for u, s in list(zip(urls, m.shards, strict=True))[2:]:
        other = opener_for(
            IoConfig(cache=CacheConfig(cache_dir=cache, cache_limit=limit, prefetch_depth=0))
        )
        assert other.ensure_cached(ObjectRef(u, s.size, s.checksum, s.pieces)) == "fetched"
        held = sum(p.stat().st_size for p in (Path(cache) / "data").rglob("*") if p.is_file())
        assert held <= limit
    assert CacheStore(cache, limit).usage() <= limit
