"""Seeing the data path: bench and plan on images, tokens and remote shards; the stats
schema on a real loader, cold and warm; plots; the idle alert; a Prometheus endpoint."""

from __future__ import annotations

import io
import json
import logging
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit import ShardDataset, WebLoader
from shardkit._types import ObjectRef
from shardkit.cli import cli
from shardkit.cli._plot import BENCH_SIZE, SHARDS_SIZE
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig
from shardkit.metrics import watch_idle
from shardkit.metrics.schema import COUNT_KEYS, WINDOW_KEYS
from shardkit.write.writer import ShardWriter
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]


def _image(fmt: str, i: int) -> bytes:
    rng = np.random.default_rng(i)
    pixels = rng.integers(0, 255, (24 + i % 3, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


@pytest.fixture
def images(tmp_path: Path) -> str:
    """60 samples, every third a png, the others jpg: samples with different fields."""
    with ShardWriter(tmp_path / "img", prefix="img", maxsize="2GB") as w:
        for i in range(60):
            ext = "png" if i % 3 == 0 else "jpg"
            w.write(
                {"__key__": f"s{i:04d}", ext: _image(ext.replace("jpg", "jpeg"), i), "cls": b"1"}
            )
            if i % 20 == 19:
                w.next_shard()
    return str(tmp_path / "img" / "manifest.json")


@pytest.fixture
def tokens(make_shards: MakeShards) -> Manifest:
    return make_shards([40, 30, 50], tokens=328)


def _cli(*args: str) -> Any:
    res = CliRunner().invoke(cli, list(args))
    return res


@pytest.mark.parametrize("decode", ["--decode", "--no-decode"])
def test_bench_and_plan_on_a_mixed_jpg_png_set(images: str, decode: str) -> None:
    res = _cli("bench", images, "--workers", "2", "--batch-size", "8", "--seconds", "0.5",
               decode, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["samples"] > 0 and stats["errors"] == 0 and stats["skipped_samples"] == 0
    plan = _cli("plan", "--micro-batch", "4", "--step-time", "10", "--manifest", images,
                "--workers", "0", "--seconds", "0.3", decode, "--json")  # fmt: skip
    assert plan.exit_code == 0, plan.output
    n = json.loads(plan.output)
    assert n["mode"] == "samples" and n["samples_per_s"] == 4 / 10
    m = Manifest.load(images)
    assert n["bytes_per_s"] == pytest.approx(0.4 * m.total_bytes / m.total_samples)
    assert n["covered"] and n["measured_samples_per_s"] > 0 and n["workers_needed"] == 1


def test_plan_for_tokens_uses_the_token_fields_dtype_and_count(tokens: Manifest) -> None:
    manifest = str(Path(tokens.base or "") / "manifest.json")
    args = ["plan", "--seq-len", "2048", "--micro-batch", "8", "--accum", "4"]
    args += ["--world-size", "64", "--step-time", "2", "--manifest", manifest]
    res = _cli(*args, "--measured", "1000", "--json")
    assert res.exit_code == 0, res.output
    n = json.loads(res.output)
    field = tokens.fields["tokens.npy"]
    assert n["token_field"] == "tokens.npy" and n["token_dtype"] == "int32"
    header = 128  # numpy's npy header for a 1-D array
    per_sample = (field["bytes"] - header * field["count"]) / 4 / tokens.total_samples
    assert per_sample == 328 and n["tokens_per_sample"] == per_sample
    tokens_per_s = 2048 * 8 * 4 * 64 / 2
    want = tokens_per_s / per_sample * tokens.total_bytes / tokens.total_samples
    assert n["bytes_per_s"] == pytest.approx(want)
    assert n["bytes_per_s_per_rank"] == pytest.approx(want / 64)
    assert n["bytes_per_token"] > 4  # int32 ids, plus the tar's and the json's share
    short = _cli(*args, "--measured", str(want / 64 / 1e6 / 2))
    assert short.exit_code == 1 and "does NOT cover" in short.output
    assert "tokens.npy: int32, 328.0 tokens a sample" in short.output
    given = _cli(*args, "--token-dtype", "int32", "--measured", "1000", "--json")
    assert json.loads(given.output)["bytes_per_s"] == pytest.approx(want)


def _same_schema(stats: dict[str, Any]) -> None:
    assert {*WINDOW_KEYS} <= set(stats) and set(stats["this_epoch"]) >= set(WINDOW_KEYS)
    assert all(type(stats[k]) is int for k in COUNT_KEYS)


def test_stats_are_the_same_schema_cold_and_warm_over_a_real_cache(
    tokens: Manifest, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    with RangeServer(str(tokens.base)) as srv:
        url = srv.url("manifest.json")
        runs, fetched = [], []
        for _ in range(2):
            res = _cli("bench", url, "--workers", "2", "--batch-size", "8", "--epochs", "1",
                       "--seconds", "60", "--cache-dir", cache, "--json")  # fmt: skip
            assert res.exit_code == 0, res.output
            runs.append(json.loads(res.output))
            objects = srv.requests("/data-*") + srv.requests("/.index/data-*")  # shards, indexes
            fetched.append({r.path for r in objects})
            srv.clear_log()
        plan = _cli("plan", "--seq-len", "512", "--micro-batch", "2", "--step-time", "1",
                    "--manifest", url, "--cache-dir", cache, "--workers", "0", "--seconds",
                    "0.3", "--json")  # fmt: skip
        assert plan.exit_code == 0, plan.output
        assert json.loads(plan.output)["tokens_per_sample"] == 328
    cold, warm = runs
    assert set(cold) == set(warm) and set(cold["io"]) == set(warm["io"])
    for s in runs:
        _same_schema(s)
    # every object downloaded (3 shards, and the index of one that two workers split) is
    # one miss; an open of what another worker had just fetched is a hit
    assert cold["cache_misses"] == len(fetched[0]) >= 3 and cold["bytes_fetched"] > 0
    opens = cold["io"]["cache_hits"] + cold["io"]["cache_misses"]
    assert cold["cache_hits"] == opens - len(fetched[0])
    assert cold["cache_hit_ratio"] == pytest.approx(cold["cache_hits"] / opens)
    assert fetched[1] == set() and warm["cache_misses"] == 0 and warm["cache_hits"] == opens
    assert warm["cache_hit_ratio"] == 1.0 and warm["requests"] == warm["bytes_fetched"] == 0
    st = _cli("cache", "stat", "--cache-dir", cache, "--limit", "10MB", "--json")
    d = json.loads(st.output)
    assert d["shards"] == 3 and d["shard_bytes"] == tokens.total_bytes
    assert d["limit"] == 10_000_000 and 0 < d["used_fraction"] < 1


def test_cache_stat_tells_indexes_from_shards_and_shows_the_limit(
    tokens: Manifest, tmp_path: Path
) -> None:
    from shardkit.cache import CachingOpener
    from shardkit.io import IoConfig

    cache = str(tmp_path / "cache")
    with RangeServer(str(tokens.base)) as srv:
        opener = CachingOpener(IoConfig(cache=CacheConfig(cache_dir=cache)))
        for e in tokens.shards:
            opener.ensure_cached(ObjectRef(srv.url(e.url), e.size, e.checksum))
            assert e.index is not None and e.index_checksum is not None
            index = Path(str(tokens.base)) / e.index
            opener.ensure_cached(
                ObjectRef(srv.url(e.index), index.stat().st_size, e.index_checksum)
            )
    res = _cli("cache", "stat", "--cache-dir", cache)
    assert res.exit_code == 0, res.output
    assert "3 shards" in res.output and "3 sample indexes" in res.output
    assert "limit" in res.output
    os.environ["SHARDKIT_CACHE_LIMIT"] = "1GB"
    try:
        res = _cli("cache", "stat", "--cache-dir", cache)
    finally:
        del os.environ["SHARDKIT_CACHE_LIMIT"]
    assert "of the 1.00 GB limit" in res.output or "of the 1 GB limit" in res.output, res.output


def test_bench_and_inspect_plots_are_pngs_of_the_promised_size(
    tokens: Manifest, tmp_path: Path
) -> None:
    manifest = str(Path(tokens.base or "") / "manifest.json")
    png = tmp_path / "bench.png"
    res = _cli("bench", manifest, "--workers", "2", "--batch-size", "8", "--seconds", "0.5",
               "--plot", str(png))  # fmt: skip
    assert res.exit_code == 0, res.output
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == BENCH_SIZE
        assert len(im.convert("L").getcolors(1 << 16) or ()) > 10  # something was drawn
    shards = tmp_path / "shards.png"
    res = _cli("inspect", manifest, "--plot", str(shards))
    assert res.exit_code == 0, res.output
    with Image.open(shards) as im:
        assert im.format == "PNG" and im.size == SHARDS_SIZE


def test_bench_tune_sweeps_and_names_a_setting(tokens: Manifest) -> None:
    manifest = str(Path(tokens.base or "") / "manifest.json")
    args = ["bench", manifest, "--tune", "--tune-workers", "0,1", "--tune-prefetch", "2,4"]
    res = _cli(*args, "--seconds", "0.3", "--batch-size", "8", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    settings = [(r["workers"], r["prefetch_factor"]) for r in out["rows"]]
    assert settings == [(0, None), (1, 2), (1, 4)]
    assert all(r["samples_per_s"] > 0 and r["cpu_cores"] > 0 for r in out["rows"])
    assert out["choice"] in out["rows"] and out["feeds_target"]
    text = _cli(*args, "--seconds", "0.3", "--target", "1e12")
    assert text.exit_code == 1 and "no setting feeds" in text.output


def test_the_idle_alert_fires_on_a_loader_slowed_on_purpose(
    tokens: Manifest, caplog: pytest.LogCaptureFixture
) -> None:
    def slow(sample: Any) -> Any:
        time.sleep(0.01)  # a decode far slower than the (empty) training step
        return sample

    ds = ShardDataset(tokens, seed=0).map(slow).to_tuple("__key__").batched(2)
    loader = WebLoader(ds, num_workers=0)
    seen: list[dict[str, Any]] = []
    watch_idle(loader, threshold=0.10, steps=5, callback=seen.append)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        for _ in zip(range(12), loader, strict=False):
            pass
    assert len(seen) == 1 and seen[0]["idle_share"] > 0.10 and seen[0]["steps"] == 5
    assert "waited for data" in caplog.text


def test_a_prometheus_endpoint_serves_the_live_stats(tokens: Manifest) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from shardkit.metrics.export import serve_prometheus

    ds = ShardDataset(tokens, seed=0).to_tuple("__key__").batched(10)
    loader = WebLoader(ds, num_workers=0)
    server = serve_prometheus(loader, port=0, rank=0)
    try:
        n = sum(1 for _ in loader)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["shardkit_loader_batches"].samples[0].value == n == 12
    assert families["shardkit_loader_samples"].samples[0].labels == {"rank": "0"}
    assert families["shardkit_loader_samples"].samples[0].value == tokens.total_samples


def test_errors_by_kind_and_skips_reach_the_stats(make_shards: MakeShards) -> None:
    m = make_shards([10, 10, 10])
    base = Path(str(m.base))
    (base / m.shards[1].url).write_bytes(b"\0" * 100 + b"not a tar" * 50)  # hostile
    os.unlink(base / m.shards[2].url)  # missing
    ds = ShardDataset(m, handler="warn").to_tuple("__key__").batched(5)
    loader = WebLoader(ds, num_workers=0)
    assert sum(len(b[0]) for b in loader) == 10
    s = loader.stats()
    assert s["skipped_shards"] == 2 and s["skipped_samples"] == 20
    kinds = {k: v for k, v in s.items() if k.startswith("errors_") and v}
    # the damaged shard is found by verification first (issue 20: local shards are verified)
    assert kinds == {"errors_fetch": 1, "errors_checksum": 1} and s["errors"] == 2
    assert s["errors_decode"] == 0 and s["this_epoch"]["errors"] == 2
