"""``shardkit bench`` and ``shardkit plan`` through the real CLI group."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.format.manifest.model import Manifest

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]


@pytest.fixture
def manifest(make_shards: MakeShards) -> str:
    m = make_shards([40, 30, 50], tokens=128)
    return str(Path(m.base or "") / "manifest.json")


def test_bench_streams_and_reports_json(manifest: str) -> None:
    args = ["bench", manifest, "--workers", "0", "--batch-size", "8", "--seconds", "0.3"]
    res = CliRunner().invoke(cli, [*args, "--json", "--decode", "--shuffle", "10"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert 0 < stats["samples"] <= 8 * stats["batches"]
    assert stats["bytes"] > stats["samples"] * 512  # 128 int32 tokens and a json each
    assert stats["samples_per_s"] > 0 and stats["mb_per_s"] > 0
    assert stats["workers"] == 0 and stats["batch_size"] == 8 and stats["decode"] is True
    assert stats["epochs"] >= 1 and stats["skipped_shards"] == 0
    parts = [stats[f"time_{k}_s"] for k in ("read", "decode", "collate", "other")]
    assert all(p > 0 for p in parts) and sum(parts) <= stats["time_worker_s"] * 1.001 + 1e-6
    assert 0 < stats["time_verify_s"] <= stats["time_read_s"]
    assert stats["time_transfer_s"] == 0  # no worker processes


def test_bench_human_output_with_workers(manifest: str) -> None:
    res = CliRunner().invoke(cli, ["bench", manifest, "--workers", "2", "--seconds", "0.5"])
    assert res.exit_code == 0, res.output
    assert "samples/s" in res.output and "MB/s" in res.output and "p99" in res.output
    assert "2 workers, batches of 32" in res.output
    assert "worker time" in res.output and "read " in res.output and "collate " in res.output
    assert "verify " in res.output and "transfer " in res.output
    # the loop does no work: its wait share is the loader's pace, said as such, not an alarm
    assert "the loop waited" not in res.output
    assert "bench's loop does no work" in res.output and "(shardkit plan)" in res.output


def test_bench_of_a_missing_manifest_is_an_error_naming_it(tmp_path: Path) -> None:
    from shardkit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", str(tmp_path / "nope.json"), "--seconds", "0.2"])
    assert exc.value.code == 1


def test_plan_computes_the_rates_a_run_needs() -> None:
    args = ["plan", "--seq-len", "2048", "--micro-batch", "8", "--accum", "4"]
    args += ["--world-size", "64", "--step-time", "2", "--bytes-per-token", "2", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    n = json.loads(res.output)
    assert n["sequences_per_s"] == 8 * 4 * 64 / 2
    assert n["tokens_per_s"] == 2048 * 8 * 4 * 64 / 2
    assert n["bytes_per_s"] == 2 * n["tokens_per_s"]
    assert n["bytes_per_s_per_rank"] == n["bytes_per_s"] / 64
    assert "measured_bytes_per_s" not in n


def test_plan_sets_the_need_against_a_measured_rate(manifest: str, tmp_path: Path) -> None:
    base = ["plan", "--seq-len", "1024", "--micro-batch", "4", "--step-time", "0.5"]
    # one rank needs 1024 * 4 / 0.5 * 2 bytes = 16.4 KB/s
    ok = CliRunner().invoke(cli, [*base, "--measured", "0.1"])
    assert ok.exit_code == 0 and "covers" in ok.output and "NOT" not in ok.output
    short = CliRunner().invoke(cli, [*base, "--measured", "0.01"])
    assert short.exit_code == 1 and "does NOT cover" in short.output
    bench = tmp_path / "bench.json"
    # with the manifest, the need comes from its token field (128 int32 tokens a
    # sample): 8192 tokens/s = 64 samples/s of about 2.2 KB, more than 0.02 MB/s
    bench.write_text(json.dumps({"mb_per_s": 0.02}))
    res = CliRunner().invoke(
        cli, [*base, "--manifest", manifest, "--measured", str(bench), "--json"]
    )
    n = json.loads(res.output)
    assert res.exit_code == 1 and not n["covered"] and n["measured_bytes_per_s"] == 0.02 * 1e6
    assert n["samples_per_s"] == 1024 * 4 / 0.5 / 128
    bench.write_text(json.dumps({"mb_per_s": 1.0}))
    res = CliRunner().invoke(
        cli, [*base, "--manifest", manifest, "--measured", str(bench), "--json"]
    )
    n = json.loads(res.output)
    assert res.exit_code == 0 and n["covered"] and n["measured_bytes_per_s"] == 1e6
    m = Manifest.load(manifest)
    assert n["bytes_per_sample"] == m.total_bytes / m.total_samples
    assert n["samples_per_s"] == pytest.approx(n["bytes_per_s"] / n["bytes_per_sample"])
    measured_now = CliRunner().invoke(
        cli, [*base, "--manifest", manifest, "--workers", "0", "--seconds", "0.3", "--json"]
    )
    assert measured_now.exit_code == 0, measured_now.output
    assert json.loads(measured_now.output)["measured_bytes_per_s"] > 0
    bad = CliRunner().invoke(cli, [*base, "--measured", "fast"])
    assert bad.exit_code == 2


def test_plan_measures_decoded_by_default_and_says_so(manifest: str) -> None:
    base = ["plan", "--micro-batch", "4", "--step-time", "1", "--manifest", manifest]
    base += ["--workers", "0", "--seconds", "0.3"]
    res = CliRunner().invoke(cli, base)
    assert res.exit_code == 0, res.output
    assert "with 0 workers, decoded" in res.output and "NOT decoded" not in res.output
    raw = CliRunner().invoke(cli, [*base, "--no-decode", "--json"])
    assert raw.exit_code == 0, raw.output
    assert json.loads(raw.output)["measured_decoded"] is False
    said = CliRunner().invoke(cli, [*base, "--no-decode"])
    assert "NOT decoded (decode costs left out" in said.output


def test_demo_streams_what_it_built() -> None:
    res = CliRunner().invoke(cli, ["demo", "--samples", "120", "--maxsize", "64KB", "--json"])
    assert res.exit_code == 0, res.output
    stream = json.loads(res.output)["stream"]
    assert stream["samples"] == 120 and stream["epochs"] == 1 and stream["decode"] is True
    assert stream["samples_per_s"] > 0 and stream["skipped_shards"] == 0


def test_bench_on_bad_data_one_line_or_a_handler(tmp_path: Path) -> None:
    """A bad shard read in a DataLoader worker printed the worker's 40-line traceback
    naming no shard; now one line naming shard and byte offset, and --handler decides."""
    from tests.helpers.hostile import EOA, good, one_shard_set
    from tests.helpers.readback import shardkit

    data = good(3)[:-1024] + b"x" * 512 + EOA  # a damaged header after 3 good samples
    manifest = one_shard_set(tmp_path / "set", "bad.tar", data, nsamples=3)
    args = ("bench", manifest, "--workers", "1", "--seconds", "2")
    r = shardkit(*args)
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, r.stderr
    assert "bad.tar at byte" in line and "bad header checksum" in line, line
    skip = shardkit(*args, "--handler", "skip_shard", "--json")
    assert skip.returncode == 0, skip.stderr
    assert json.loads(skip.stdout)["skipped_shards"] >= 1


def test_tune_table_says_what_idle_means() -> None:
    from shardkit.cli._tune import tune_lines

    row = {"workers": 2, "prefetch_factor": 2, "samples_per_s": 900.0, "mb_per_s": 3.0,
           "wait_fraction": 0.97, "first_batch_s": 0.1, "cpu_cores": 1.5}  # fmt: skip
    result = {"rows": [row], "choice": row, "feeds_target": True,
              "target_samples_per_s": 500.0, "target_from": "--target"}  # fmt: skip
    lines = tune_lines(result)
    assert " 97.0% " in lines[1]
    assert lines[2].startswith("(idle: the share of time bench's empty loop waited")
