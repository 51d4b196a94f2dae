"""Hostile review of issue 32 (the stall watchdog): ``stall_warn`` and ``stall_stacks`` as
a config file or a careless call gives them. ``stall_warn='300'`` was a bare TypeError from
a comparison, ``stall_warn=True`` a watch of 1 s, and ``stall_stacks='no'`` (truthy) dumped
every worker's stacks with each report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit as sk
from shardkit.errors import ConfigError


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = Path(tmp_path_factory.mktemp("stall")) / "set"
    with sk.ShardWriter(out, maxcount=8) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "tokens.npy": np.arange(i + 1, dtype=np.int32)})
    return str(out / "manifest.json")


@pytest.mark.parametrize("warn", ["300", True, np.bool_(True), float("nan"), 0, -1.0, [5]])
def test_stall_warn_is_seconds(manifest: str, warn: Any) -> None:
    with pytest.raises(ConfigError, match="stall_warn"):
        sk.WebLoader(sk.ShardDataset(manifest), stall_warn=warn)


@pytest.mark.parametrize("stacks", ["no", 1, None])
def test_stall_stacks_is_a_bool(manifest: str, stacks: Any) -> None:
    with pytest.raises(ConfigError, match="stall_stacks"):
        sk.WebLoader(sk.ShardDataset(manifest), stall_stacks=stacks)


@pytest.mark.parametrize("warn", [np.float32(2.5), 7, float("inf"), None])
def test_good_stall_warns_are_taken(manifest: str, warn: Any) -> None:
    loader = sk.WebLoader(sk.ShardDataset(manifest), stall_warn=warn)
    assert sum(1 for _ in loader) == 4


@pytest.mark.timeout(30)
def test_a_stall_report_never_names_a_shard_the_thread_has_finished(
    manifest: str, make_shards: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """0 workers: a loader read a local set to its end, then another stalls on the first
    bytes of a remote shard. The report named the first loader's finished shard ('at
    .../set/data-000000.tar byte 5120 waits on fetch of http://...'): where the thread
    read last, not where it waits."""
    import logging

    from tests.helpers.servers import RangeServer

    assert sum(1 for _ in sk.WebLoader(sk.ShardDataset(manifest))) == 4
    data = make_shards([4], tokens=50)
    with RangeServer(str(data.base), latency=0.8) as srv:  # every answer's headers late
        ds = sk.ShardDataset(srv.url("manifest.json"), shardshuffle=False)
        loader = sk.WebLoader(ds, stall_warn=0.3)
        with caplog.at_level(logging.WARNING, logger="shardkit.streaming.stall"):
            assert sum(1 for _ in loader) == 4
    url = srv.url(data.shards[0].url)
    report = caplog.records[0].getMessage()
    assert f"at {url} byte 0 waits on fetch of {url}" in report, report
    assert manifest.rsplit("/", 1)[0] not in report, report
