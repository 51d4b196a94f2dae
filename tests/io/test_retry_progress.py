"""A remote read whose connection drops again and again still arrives whole while the drops
make progress (the retry count and the backoff start again after each ``min_progress``
bytes), and gives up naming the url, the offset and the attempts once they stop making it;
a server that sends a byte and drops, forever, is given up after ``max_attempts`` tries.
Real servers on 127.0.0.1: the Range server (HTTP, the node cache's fill) and moto behind
the fault proxy (s3)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.cache import opener_for
from shardkit.errors import ConfigError, FetchError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, RetryPolicy, load_manifest
from shardkit.io.remote import UncachedOpener
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer, moto_server, s3_bucket

pytestmark = pytest.mark.integration

STEP = 4096  # the tests' min_progress: small, so that many drops fit a small object
SIZE = 40 * STEP + 123
# 3 tries without progress; waits of milliseconds; a deadline no test comes near
POLICY = RetryPolicy(
    max_attempts=3, backoff_base=0.005, backoff_max=0.02, deadline=20.0, min_progress=STEP
)


@pytest.fixture
def blob(tmp_path: Path) -> bytes:
    data = random.Random(7).randbytes(SIZE)
    (tmp_path / "blob.bin").write_bytes(data)
    return data


def test_many_drops_with_progress_read_whole(tmp_path: Path, blob: bytes) -> None:
    with RangeServer(tmp_path) as srv:
        srv.add_fault("/blob.bin", "drop", after=STEP + 100, times=30)  # 30 > max_attempts
        opener = UncachedOpener(IoConfig(retry=POLICY))
        assert opener.read(srv.url("blob.bin")) == blob
        assert len(srv.requests("/blob.bin")) == 31
        assert opener.stats()["retries"] == 30


def test_drops_below_min_progress_add_up(tmp_path: Path, blob: bytes) -> None:
    """Progress is counted across tries: two drops of 2/3 of ``min_progress`` are one."""
    with RangeServer(tmp_path) as srv:
        srv.add_fault("/blob.bin", "drop", after=STEP * 2 // 3, times=40)
        assert UncachedOpener(IoConfig(retry=POLICY)).read(srv.url("blob.bin")) == blob


def test_drops_without_progress_fail_naming_url_offset_attempts(
    tmp_path: Path, blob: bytes
) -> None:
    with RangeServer(tmp_path) as srv:
        srv.add_fault("/blob.bin", "drop", after=3 * STEP, times=1)  # progress, then none
        srv.add_fault("/blob.bin", "drop", after=10, times=100)
        url = srv.url("blob.bin")
        with pytest.raises(FetchError) as err:
            UncachedOpener(IoConfig(retry=POLICY)).read(url)
        # the progress drop, then max_attempts tries of 10 bytes each
        assert len(srv.requests("/blob.bin")) == 1 + 3
    assert err.value.url == url and err.value.attempts == 3
    text = str(err.value)
    assert url in text and f"at offset {3 * STEP + 30}" in text and "after 3 attempts" in text
    assert f"the last 3 tries brought 30 bytes, under min_progress's {STEP}" in text
    assert "4 tries in all" in text


def test_a_byte_then_a_drop_forever_is_bounded(tmp_path: Path, blob: bytes) -> None:
    """The hostile trickle: each try brings one byte. It is no progress (under
    ``min_progress``), so the read ends after ``max_attempts`` tries, in milliseconds."""
    with RangeServer(tmp_path) as srv:
        srv.add_fault("/blob.bin", "drop", after=1, times=10_000)
        began = time.monotonic()
        with pytest.raises(FetchError, match="at offset 3 "):
            UncachedOpener(IoConfig(retry=POLICY)).read(srv.url("blob.bin"))
        assert time.monotonic() - began < 2
        assert len(srv.requests("/blob.bin")) == 3
        srv.clear_log()  # the default policy's 8 tries (backoff from 0.25 s, made short)
        policy = RetryPolicy(backoff_base=0.001, backoff_max=0.01)
        with pytest.raises(FetchError, match="after 8 attempts"):
            UncachedOpener(IoConfig(retry=policy)).read(srv.url("blob.bin"))
        assert len(srv.requests("/blob.bin")) == 8


def test_the_cache_fills_whole_through_drops_with_progress(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    local = make_shards([6, 5], tokens=2000, subdir="ds")
    want = read_samples(local, UncachedOpener(IoConfig()))
    shard = local.shards[0]
    assert shard.size > 12 * STEP
    with RangeServer(tmp_path) as srv:
        srv.add_fault(f"/ds/{shard.url}", "drop", after=STEP + 1, times=10)
        cfg = IoConfig(retry=POLICY, cache=CacheConfig(cache_dir=str(tmp_path / "cache")))
        opener = opener_for(cfg)
        remote = load_manifest(srv.url("ds/manifest.json"), opener)
        assert read_samples(remote, opener) == want
        assert opener.stats()["retries"] == 10


def test_s3_reads_whole_through_drops_with_progress(
    tmp_path: Path, blob: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    with moto_server() as endpoint, FaultProxy(endpoint) as proxy:
        s3_bucket(endpoint, "bkt", monkeypatch).put_object(Bucket="bkt", Key="blob.bin", Body=blob)
        proxy.add("GET", "/bkt/blob.bin", "cut", after=STEP + 100, times=12)
        opener = UncachedOpener(IoConfig(retry=POLICY, endpoint_url=proxy.url))
        assert opener.read("s3://bkt/blob.bin") == blob
        assert proxy.answered("GET", "/bkt/blob.bin").count(0) == 12
        assert opener.stats()["retries"] == 12  # each cut body a drop, never a whole answer
        proxy.add("GET", "/bkt/blob.bin", "cut", after=5, times=100)
        with pytest.raises(FetchError, match=r"at offset 15 .*after 3 attempts"):
            opener.read("s3://bkt/blob.bin")


def test_min_progress_is_a_positive_count_of_bytes() -> None:
    assert RetryPolicy().min_progress == 64 << 10
    for bad in (0, -1, 1.5, True, "64", float("nan")):
        with pytest.raises(ConfigError, match="min_progress"):
            RetryPolicy(min_progress=bad)  # type: ignore[arg-type]
