"""Issue 32 item 3: a stall has a name. A server that hangs mid-body keeps every batch
away; after ``stall_warn`` seconds the loader logs and counts, for each worker, the rank,
worker, shard and byte offset and what it waits on (a fetch: its url and attempt), with the
workers' Python stacks on request, and ``stats()`` and the Prometheus export say the same."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.format.manifest.model import Manifest
from shardkit.metrics.export import prometheus_text
from shardkit.streaming.dataset import ShardDataset
from shardkit.streaming.loader import WebLoader
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1])
def test_a_hanging_server_is_named_by_the_stall_report(
    make_shards: Callable[..., Manifest],
    caplog: pytest.LogCaptureFixture,
    workers: int,
) -> None:
    data = make_shards([10, 10], tokens=200)
    first = "/" + data.shards[0].url
    with RangeServer(str(data.base)) as srv:
        srv.add_fault("*.tar", "stall", after=1, seconds=2.5)  # one byte, then silence
        ds = ShardDataset(srv.url("manifest.json"), shardshuffle=False).batched(5)
        loader = WebLoader(ds, num_workers=workers, stall_warn=0.5, stall_stacks=workers > 0)
        with caplog.at_level(logging.WARNING, logger="shardkit.streaming.stall"):
            batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == 20  # the epoch ends whole
    stats = loader.stats()
    assert stats["stalls"] >= 1
    row = stats["stall"][0]  # the latest report's (the stall may be ending as it is made)
    assert row["rank"] == 0 and row["worker"] == (0 if workers else None)
    # made as the stall ends, the reader may be between ranges: no shard is named then
    assert row["waits"] in ("fetch", "decode") and row.get("shard", ".tar").endswith(".tar")
    # loaders of earlier tests still alive may report too (their stall_warn of 300 s): ours
    # are those naming this server
    ours = [r.getMessage() for r in caplog.records if srv.url(first) in r.getMessage()]
    assert ours, caplog.text
    first_report = ours[0]
    assert first_report.startswith("no batch for"), first_report
    assert f"at {srv.url(first)} byte 0 waits on fetch of {srv.url(first)} (attempt 1" in (
        first_report
    )
    text = caplog.text
    if workers:
        assert "stacks of pid" in text and "File " in text  # faulthandler's dump
    prom = prometheus_text(stats)
    assert "shardkit_loader_stalls_total" in prom and "shardkit_loader_stall_wait_s{" in prom


def test_a_bad_stall_warn_is_refused(make_shards: Callable[..., Manifest], tmp_path: Path) -> None:
    from shardkit.errors import ConfigError

    data = make_shards([2])
    with pytest.raises(ConfigError, match="stall_warn"):
        WebLoader(ShardDataset(str(Path(data.base) / "manifest.json")), stall_warn=0)
