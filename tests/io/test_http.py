"""http(s):// reads against a real threaded Range server on 127.0.0.1, with faults."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import make_opener, opener_for
from shardkit.errors import ChecksumError, ConfigError, FetchError, ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.io import CacheConfig, IoConfig, RetryPolicy, load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

FAST = {"backoff_base": 0.01, "backoff_max": 0.05}


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([12, 9, 15], tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    assert shards.base is not None
    with RangeServer(shards.base) as srv:
        yield srv


def local_samples(m: Manifest) -> list[dict[str, object]]:
    return read_samples(m, make_opener())


def test_manifest_and_shards_stream_identical(shards: Manifest, server: RangeServer) -> None:
    opener = make_opener()
    remote = load_manifest(server.url("manifest.json"), opener)
    assert remote.resolve(remote.shards[0].url) == server.url(shards.shards[0].url)
    assert [s.checksum for s in remote.shards] == [s.checksum for s in shards.shards]
    assert read_samples(remote, opener) == local_samples(shards)
    assert len(server.requests("/manifest.json")) == 1
    for s in shards.shards:
        (rec,) = server.requests("/" + s.url)
        assert rec.status == 206 and rec.range == f"bytes=0-{s.size - 1}"
    stats = opener.stats()
    assert stats["requests"] == 4
    assert stats["bytes_fetched"] == shards.total_bytes + server.bytes_sent("/manifest.json")


def test_one_keep_alive_connection_per_process(shards: Manifest, server: RangeServer) -> None:
    opener = make_opener()
    read_samples(load_manifest(server.url("manifest.json"), opener), opener)
    clients = {r.client for r in server.requests()}
    assert len(server.requests()) == 4 and len(clients) == 1
    clone = pickle.loads(pickle.dumps(opener))  # what a DataLoader worker gets
    assert clone.stats() == {}  # counters are per process
    clone.read(server.url(shards.shards[0].url), start=0, end=10)
    assert server.requests()[-1].client not in clients  # its own session, not a shared socket


def test_ranged_reads_use_the_sample_index(shards: Manifest, server: RangeServer) -> None:
    opener = make_opener()
    entry = shards.shards[1]
    assert entry.index is not None
    offsets = read_index(opener.read(server.url(entry.index)))
    local = (Path(str(shards.base)) / entry.url).read_bytes()
    lo, hi = int(offsets[3]), int(offsets[7])
    got = opener.read(server.url(entry.url), start=lo, end=hi)
    assert got == local[lo:hi]
    assert server.requests("/" + entry.url)[-1].range == f"bytes={lo}-{hi - 1}"
    assert (
        opener.read(server.url(entry.url), start=entry.size - 5, end=entry.size + 50)
        == (local[-5:])
    )


def test_range_size_splits_a_shard_into_requests(shards: Manifest, server: RangeServer) -> None:
    opener = opener_for(IoConfig(range_size=64 << 10))
    entry = shards.shards[0]
    data = opener.read(server.url(entry.url))
    assert data == (Path(str(shards.base)) / entry.url).read_bytes()
    ranges = [r.range for r in server.requests("/" + entry.url)]
    step = 64 << 10
    assert ranges == [
        f"bytes={lo}-{min(lo + step, entry.size) - 1}" for lo in range(0, entry.size, step)
    ]


FAULTS = {
    "drop": {"kind": "drop", "after": 30_000, "times": 2},
    "429": {"kind": "status", "status": 429, "retry_after": "1"},
    "503": {"kind": "status", "status": 503, "times": 2},
    "stall": {"kind": "stall", "after": 50_000, "seconds": 2.0},
}


@pytest.mark.parametrize("cached", [False, True], ids=["direct", "cached"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faults_heal_with_identical_samples(
    shards: Manifest, server: RangeServer, tmp_path: Path, fault: str, cached: bool
) -> None:
    victim = "/" + shards.shards[1].url
    spec = dict(FAULTS[fault])
    server.add_fault(victim, spec.pop("kind"), **spec)  # type: ignore[arg-type]
    cache_dir = tmp_path / "cache" if cached else None
    opener = opener_for(
        IoConfig(
            read_timeout=0.5, cache=CacheConfig(cache_dir=cache_dir), retry=RetryPolicy(**FAST)
        )
    )
    remote = load_manifest(server.url("manifest.json"), opener)
    assert read_samples(remote, opener) == local_samples(shards)
    reqs = server.requests(victim)
    times = FAULTS[fault].get("times", 1)
    assert len(reqs) == times + 1
    assert opener.stats()["retries"] == times
    kind = {"drop": "connection", "stall": "connection", "429": "throttled", "503": "server"}
    assert opener.stats()[f"retries_{kind[fault]}"] == times  # by kind in loader.stats()
    if fault == "drop":  # resumed from the first byte not delivered, not from 0
        assert [r.range for r in reqs] == [
            f"bytes=0-{shards.shards[1].size - 1}",
            f"bytes=30000-{shards.shards[1].size - 1}",
            f"bytes=60000-{shards.shards[1].size - 1}",
        ]
    if fault == "429":  # Retry-After: 1 was honoured
        assert reqs[1].start - reqs[0].end >= 1.0
    if fault == "stall":
        assert reqs[1].range == f"bytes=50000-{shards.shards[1].size - 1}"


def test_gives_up_with_a_fetch_error(shards: Manifest, server: RangeServer) -> None:
    url = server.url(shards.shards[0].url)
    server.add_fault("/" + shards.shards[0].url, "status", status=503, times=100)
    opener = opener_for(IoConfig(retry=RetryPolicy(max_attempts=3, **FAST)))
    with pytest.raises(FetchError) as info:
        opener.read(url)
    assert info.value.url == url and info.value.status == 503 and info.value.attempts == 3
    assert url in str(info.value) and "HTTP 503" in str(info.value)
    assert len(server.requests("/" + shards.shards[0].url)) == 3
    with pytest.raises(FetchError) as missing:
        opener.read(server.url("nope.tar"))
    assert missing.value.status == 404 and missing.value.attempts == 1


def test_connection_refused_is_a_fetch_error(shards: Manifest) -> None:
    from tests.helpers.servers import free_port

    opener = opener_for(IoConfig(connect_timeout=1.0, retry=RetryPolicy(max_attempts=2, **FAST)))
    url = f"http://127.0.0.1:{free_port()}/data-000000.tar"
    with pytest.raises(FetchError, match=r"127\.0\.0\.1") as info:
        opener.read(url)
    assert info.value.attempts == 2 and info.value.status is None


def test_corrupt_byte_is_a_checksum_error_without_cache(
    shards: Manifest, server: RangeServer
) -> None:
    entry = shards.shards[2]
    path = Path(str(shards.base)) / entry.url
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    opener = make_opener()
    with (
        pytest.raises(ChecksumError) as info,
        opener.open(ObjectRef(server.url(entry.url), entry.size, entry.checksum)) as f,
    ):
        f.read()
    assert info.value.url == server.url(entry.url) and info.value.expected == entry.checksum


def test_unsafe_manifest_urls_are_refused(tmp_path: Path, server: RangeServer) -> None:
    opener = make_opener()
    root = server.root / "sub"
    root.mkdir()
    good = load_manifest(server.url("manifest.json"), opener)
    for bad in ("pipe:cat /etc/passwd", "../outside.tar", "file:///etc/passwd", "http://x/a.tar"):
        raw = good.to_dict()
        raw["shards"][0]["url"] = bad
        (root / "evil.json").write_text(Manifest.from_dict(raw).dumps())
        evil = load_manifest(server.url("sub/evil.json"), opener)
        with pytest.raises(ManifestError, match="refusing"):
            read_samples(evil, opener)
    with pytest.raises(ConfigError, match="allow_pipe"):
        opener.read("pipe:cat /etc/hostname")
    with pytest.raises(ConfigError, match="allow_pipe"):
        load_manifest("pipe:cat manifest.json", opener)


def test_pipe_urls_only_when_allowed_in_code(shards: Manifest) -> None:
    entry = shards.shards[0]
    path = Path(str(shards.base)) / entry.url
    opener = opener_for(IoConfig(allow_pipe=True))
    assert opener.read(f"pipe:cat {path}") == path.read_bytes()
    assert opener.read(f"pipe:cat {path}", start=100, end=600) == path.read_bytes()[100:600]
    with pytest.raises(FetchError, match="status 3"):
        opener.read("pipe:exit 3")


def test_a_drop_past_the_retries_reaches_the_reader_as_a_fetch_error(
    shards: Manifest, server: RangeServer
) -> None:
    # the tar reader must not relabel a network failure as a corrupt shard
    from shardkit.format.tario.reader import read_shard

    entry = shards.shards[1]
    server.add_fault("/" + entry.url, "drop", after=30_000, times=1)
    server.add_fault("/" + entry.url, "status", status=503, times=100)  # then no way back
    opener = opener_for(IoConfig(retry=RetryPolicy(max_attempts=2, **FAST)))
    url = server.url(entry.url)
    got = []
    with (
        opener.open(ObjectRef(url, entry.size, entry.checksum)) as f,
        pytest.raises(FetchError) as info,
    ):
        got.extend(read_shard(f, url=url))
    assert info.value.url == url and info.value.status == 503
    assert len(got) < entry.nsamples
