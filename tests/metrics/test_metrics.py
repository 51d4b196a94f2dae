"""Loader stats: the fixed schema, cache accounting, windows, the idle alert, exporters."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit.errors import ConfigError
from shardkit.metrics import IdleAlert, LoaderStats, job_summary, watch_idle
from shardkit.metrics.schema import COUNT_KEYS, IO_KEYS, RATE_KEYS, WINDOW_KEYS
from shardkit.stages.collate import collate_numpy

TOP = {"schema", "epoch", "iterations", "this_epoch", *WINDOW_KEYS}


def _run(stats: LoaderStats, io: dict[str, float], batches: int = 6, epoch: int = 0) -> None:
    """Two workers, 8 samples of 100 bytes a batch, each batch carrying ``io`` so far."""
    stats.start(epoch)
    for i in range(batches):
        w, k = i % 2, i // 2 + 1
        counters = {"samples": 8.0 * k, "bytes": 800.0 * k, "skipped_shards": 0.0}
        stats.record(0.001 * (i + 1), w, counters, {n: v * k for n, v in io.items()})
    stats.stop()


def test_keys_and_types_are_the_same_cold_warm_and_local() -> None:
    cold, warm, local = LoaderStats(), LoaderStats(), LoaderStats()
    _run(cold, {"cache_misses": 1, "cache_fills": 1, "bytes_fetched": 5000, "requests": 2})
    _run(warm, {"cache_hits": 1})
    _run(local, {})
    summaries = [s.summary() for s in (cold, warm, local)]
    for d in summaries:
        assert set(d) == TOP
        assert set(d["this_epoch"]) == set(WINDOW_KEYS)
        for key in COUNT_KEYS:
            assert type(d[key]) is int and type(d["this_epoch"][key]) is int, key
        for key in RATE_KEYS:
            assert type(d[key]) is float, key
        assert set(d["io"]) == set(IO_KEYS) and all(type(v) is int for v in d["io"].values())
        assert [w["worker"] for w in d["per_worker"]] == [0, 1]
        assert d["samples"] == 48 and d["bytes"] == 4800 and d["batches"] == 6
    c, w, lo = summaries
    assert (c["cache_hits"], c["cache_misses"], c["cache_hit_ratio"]) == (0, 6, 0.0)
    assert (w["cache_hits"], w["cache_misses"], w["cache_hit_ratio"]) == (6, 0, 1.0)
    assert c["bytes_fetched"] == 30_000 and c["requests"] == 12
    assert lo["cache_hits"] == lo["cache_misses"] == 0


def test_a_shard_prefetched_then_opened_is_a_miss_not_a_hit() -> None:
    stats = LoaderStats()
    # the prefetch fetched 3 shards before their reader came: 3 raw hits, 1 raw miss
    _run(stats, {"cache_hits": 3, "cache_misses": 1, "cache_fills": 4, "prefetches": 3}, 2)
    d = stats.summary()
    assert d["io"]["cache_hits"] == 6 and d["cache_hits"] == 0 and d["cache_misses"] == 8


def test_windows_percentiles_first_batch_and_workers() -> None:
    stats = LoaderStats()
    _run(stats, {}, batches=6, epoch=0)
    _run(stats, {}, batches=4, epoch=1)
    d = stats.summary()
    e = d["this_epoch"]
    assert d["epoch"] == 1 and d["iterations"] == 2
    assert d["batches"] == 10 and e["batches"] == 4
    assert d["samples"] == 48 + 32 and e["samples"] == 32
    assert e["wait_p50_s"] == pytest.approx(np.percentile([0.001, 0.002, 0.003, 0.004], 50))
    assert e["wait_max_s"] == pytest.approx(0.004) and d["wait_max_s"] == pytest.approx(0.006)
    assert d["wait_total_s"] == pytest.approx(0.021 + 0.010)
    assert 0 < e["first_batch_s"] <= e["seconds"] and d["first_batch_s"] > 0
    assert 0 < d["wait_fraction"] <= 1
    assert [w["samples"] for w in d["per_worker"]] == [24 + 16, 24 + 16]
    assert [w["batches"] for w in e["per_worker"]] == [2, 2]


def test_retries_and_errors_by_kind_and_extra_counters() -> None:
    stats = LoaderStats()
    stats.start(0)
    counters = {"samples": 8.0, "errors_decode": 2.0, "errors_fetch": 1.0, "skipped_samples": 3.0}
    io = {"retries": 3.0, "retries_throttled": 1.0, "retries_connection": 2.0}
    stats.record(0.0, 0, counters, {**io, "checksum_failures": 1.0}, job_skipped_samples=5)
    stats.record(0.0, 0, counters, io, job_skipped_samples=7)
    d = stats.summary()
    assert d["retries"] == 4 and d["retries_throttled"] == 1 and d["retries_connection"] == 2
    assert d["retries_checksum"] == 1 and d["retries_server"] == 0
    assert d["errors"] == 3 and d["errors_decode"] == 2 and d["errors_fetch"] == 1
    assert d["errors_format"] == d["errors_checksum"] == d["errors_other"] == 0
    assert d["skipped_samples"] == 3 and d["job_skipped_samples"] == 7
    assert d["this_epoch"]["job_skipped_samples"] == 7


def test_job_summary_without_a_process_group_is_a_job_of_one() -> None:
    stats = LoaderStats()
    _run(stats, {"cache_hits": 1})
    d = stats.summary()
    job = job_summary(d)
    assert job["world_size"] == 1
    assert job["sum"]["samples"] == d["samples"] and type(job["sum"]["samples"]) is int
    assert job["min"]["wait_fraction"] == job["max"]["wait_fraction"] == d["wait_fraction"]
    assert "per_worker" not in job["sum"] and "epoch" not in job["sum"]


def test_the_idle_alert_fires_once_per_episode_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[dict[str, Any]] = []
    alert = IdleAlert(threshold=0.30, steps=4, callback=seen.append)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        for _ in range(10):
            alert.observe(0.001, 0.1)  # 1% idle
        assert seen == []
        for _ in range(2):
            alert.observe(0.05, 0.1)  # 50% idle: over the last 4 steps, 25%
        assert seen == []
        alert.observe(0.05, 0.1)  # now 38% over the last 4 steps
        assert len(seen) == 1 and seen[0]["idle_share"] == pytest.approx(0.151 / 0.4)
        for _ in range(10):
            alert.observe(0.05, 0.1)  # still idle: no new alert
        assert len(seen) == 1
        for _ in range(4):
            alert.observe(0.0, 0.1)  # back under the threshold, then idle again
        for _ in range(4):
            alert.observe(0.09, 0.1)
    assert len(seen) == 2 and alert.fired == 2
    assert "waited for data" in caplog.text and "38%" in caplog.text


def test_the_alert_skips_the_first_batch_of_an_iteration() -> None:
    stats = LoaderStats()
    seen: list[dict[str, Any]] = []
    watch_idle(stats, threshold=0.5, steps=2, callback=seen.append)
    stats.start(0)
    stats.record(1.0, 0)  # workers starting: all wait, not counted
    assert seen == []
    with pytest.raises(ConfigError):
        watch_idle(object())
    with pytest.raises(ConfigError):
        IdleAlert(threshold=1.5)


def test_collate_keeps_every_field_of_samples_that_differ() -> None:
    batch = collate_numpy(
        [
            {"__key__": "a", "jpg": b"J", "cls": 1},
            {"__key__": "b", "png": b"P", "cls": 2},
            {"__key__": "c", "jpg": b"K", "cls": 3, "json": {"x": 1}},
        ]
    )
    assert batch["__key__"] == ["a", "b", "c"]
    assert batch["jpg"] == [b"J", None, b"K"] and batch["png"] == [None, b"P", None]
    assert batch["json"] == [None, None, {"x": 1}]
    assert batch["cls"].tolist() == [1, 2, 3]
    same = collate_numpy([{"a": np.zeros(2)}, {"a": np.ones(2)}])
    assert same["a"].shape == (2, 2)


def test_prometheus_text_parses_back_with_its_library(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from shardkit.metrics.export import prometheus_text, write_prometheus

    stats = LoaderStats()
    _run(stats, {"cache_hits": 1})
    d = stats.summary()
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(d, rank=3))}
    samples = families["shardkit_loader_samples"]
    assert samples.type == "counter"
    assert samples.samples[0].value == d["samples"] and samples.samples[0].labels == {"rank": "3"}
    assert families["shardkit_loader_wait_p99_s"].type == "gauge"
    assert families["shardkit_loader_epoch_batches"].samples[0].value == 6
    workers = families["shardkit_loader_worker_samples_per_s"].samples
    assert sorted(s.labels["worker"] for s in workers) == ["0", "1"]
    path = tmp_path / "loader.prom"
    write_prometheus(path, d)
    parsed = list(text_string_to_metric_families(path.read_text()))
    assert len(parsed) == len(families) and list(tmp_path.iterdir()) == [path]


def test_tensorboard_scalars_read_back_by_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from shardkit.metrics.export import tensorboard

    stats = LoaderStats()
    _run(stats, {})
    writer = SummaryWriter(str(tmp_path))
    for step in (10, 20):
        tensorboard(writer, stats.summary(), step)
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"data/samples_per_s", "data/wait_fraction", "data/epoch/wait_p99_s"} <= tags
    assert {"data/worker0/samples_per_s", "data/worker1/samples_per_s"} <= tags
    events = acc.Scalars("data/samples")
    assert [e.step for e in events] == [10, 20] and events[0].value == 48
