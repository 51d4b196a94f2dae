"""Every remote read ends: against the fault-injecting server, a huge ``Retry-After`` and a
server that stalls after part of every answer give a FetchError naming the url, the
attempts and the time spent, within the configured deadline (pytest-timeout is the bound:
the old behaviour waited 120 s per attempt, or read on as long as bytes trickled)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from shardkit import FetchError, ShardDataset, WebLoader
from shardkit.cache import make_opener
from shardkit.format.manifest.model import Manifest
from shardkit.io import IoConfig
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

FAST = {"backoff_base": 0.02, "backoff_max": 0.1}


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([6, 6], tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    assert shards.base is not None
    with RangeServer(shards.base) as srv:
        yield srv


@pytest.mark.timeout(60)
def test_a_huge_retry_after_is_not_waited_for(shards: Manifest, server: RangeServer) -> None:
    victim = shards.shards[1].url
    server.add_fault("/" + victim, "status", status=429, retry_after="86400", times=1000)
    io = IoConfig.make(deadline=20.0, **FAST)
    ds = ShardDataset(server.url("manifest.json"), shardshuffle=False, io=io)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(FetchError) as info:
        list(loader)
    text = str(info.value)
    assert server.url(victim) in text and "HTTP 429" in text
    assert "after 1 attempt" in text and "the deadline is 20 s" in text


@pytest.mark.timeout(60)
def test_a_server_stalling_after_every_partial_answer_runs_out(
    shards: Manifest, server: RangeServer
) -> None:
    victim = shards.shards[0].url
    server.add_fault("/" + victim, "stall", after=2000, seconds=5.0, times=1000)
    opener = make_opener(read_timeout=0.3, max_attempts=3, **FAST)
    with pytest.raises(FetchError) as info:
        opener.read(server.url(victim))
    assert info.value.url == server.url(victim) and info.value.attempts == 3
    assert "giving up after" in str(info.value)
    # each answer delivered its 2000 bytes and the next asked from there: progress, yet bounded
    ranges = [r.range for r in server.requests("/" + victim)]
    assert [r.split("-")[0] for r in ranges] == ["bytes=0", "bytes=2000", "bytes=4000"]


@pytest.mark.timeout(60)
def test_the_deadline_bounds_many_attempts(shards: Manifest, server: RangeServer) -> None:
    victim = shards.shards[0].url
    server.add_fault("/" + victim, "stall", after=500, seconds=5.0, times=1000)
    opener = make_opener(read_timeout=0.2, max_attempts=10_000, deadline=1.0, **FAST)
    with pytest.raises(FetchError, match="the deadline is 1 s") as info:
        opener.read(server.url(victim))
    assert 1 < info.value.attempts < 10_000
