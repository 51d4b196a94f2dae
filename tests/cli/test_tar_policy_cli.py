"""``--tar-policy strict|lenient`` on every command that reads tars, as real processes.

The shard holds a symbolic link, a FIFO, a character device and a member of the unknown
type ``Q`` between its regular members (:func:`special_members_tar`): ``strict`` (the
default) refuses it naming the shard and the link's offset; ``lenient`` reads every
regular member, the samples webdataset gives, and says how many members it skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit import read_shard
from shardkit.format.manifest.model import Manifest
from tests.helpers.readback import read_samples, shardkit
from tests.helpers.tarcorpus import sorted_samples, special_members_tar, webdataset_samples

pytestmark = pytest.mark.integration

NAME = "foreign-000000.tar"
NSAMPLES = 10


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "set" / NAME
    path.parent.mkdir()
    return path, special_members_tar(path, NSAMPLES)


def _refused(stderr: str, at: int) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert NAME in lines[0] and f"at byte {at}" in lines[0], lines[0]
    assert "--tar-policy lenient" in lines[0]


def _warned(stderr: str, n: int = 4) -> None:
    assert any(NAME in ln and f"skipped {n} members" in ln for ln in stderr.splitlines()), stderr


@pytest.mark.timeout(120)
def test_manifest_from_shards_and_verify(shard: tuple[Path, int]) -> None:
    path, at = shard
    r = shardkit("manifest", "from-shards", path.parent, "--no-progress")
    assert r.returncode == 1, r.stdout + r.stderr
    _refused(r.stderr, at)
    r = shardkit("manifest", "from-shards", path.parent, "--tar-policy", "lenient", "--json")
    assert r.returncode == 0, r.stderr
    _warned(r.stderr)
    manifest = path.parent / "manifest.json"
    assert json.loads(r.stdout)["samples"] == NSAMPLES
    # verify --deep: strict names the shard and offset as a format problem
    r = shardkit("verify", manifest, "--deep", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    (problem,) = report["problems"]
    assert problem["kind"] == "format" and problem["url"] == NAME and problem["offset"] == at
    r = shardkit("verify", manifest, "--deep", "--json", "--tar-policy", "lenient")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["skipped_members"] == {NAME: 4}, report
    assert any(NAME in w and "skipped 4 members" in w for w in report["warnings"]), report
    r = shardkit("verify", manifest, "--decode", "--tar-policy", "lenient")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"warning: {NAME}: skipped 4 members" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_inspect_a_shard(shard: tuple[Path, int]) -> None:
    path, at = shard
    r = shardkit("inspect", path)
    assert r.returncode == 1, r.stdout + r.stderr
    _refused(r.stderr, at)
    r = shardkit("inspect", path, "--json", "--tar-policy", "lenient")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["samples"] == NSAMPLES and d["skipped_members"] == 4, d
    _warned(r.stderr)


@pytest.mark.timeout(120)
def test_build_from_a_foreign_shard(shard: tuple[Path, int], tmp_path: Path) -> None:
    path, at = shard
    r = shardkit("build", path, "-o", tmp_path / "out", "--no-progress")
    assert r.returncode == 1, r.stdout + r.stderr
    assert NAME in r.stderr and f"at byte {at}" in r.stderr, r.stderr
    out = tmp_path / "out2"
    r = shardkit("build", path, "-o", out, "--tar-policy", "lenient", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    _warned(r.stderr)
    got = read_samples(out / "manifest.json")
    assert sorted_samples(got) == sorted_samples(webdataset_samples(path))
    # the built shards are plain: a strict reader reads them
    m = Manifest.load(out / "manifest.json")
    assert sum(1 for e in m.shards for _ in read_shard(m.resolve(e.url))) == NSAMPLES


@pytest.mark.timeout(120)
def test_bench_reads_with_the_policy(shard: tuple[Path, int]) -> None:
    path, _ = shard
    r = shardkit("manifest", "from-shards", path.parent, "--tar-policy", "lenient")
    assert r.returncode == 0, r.stderr
    manifest = path.parent / "manifest.json"
    args = ("bench", manifest, "--workers", "2", "--batch-size", "2", "--epochs", "1")
    r = shardkit(*args, "--seconds", "60")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and NAME in lines[0] and "at byte" in lines[0], r.stderr
    r = shardkit(*args, "--seconds", "60", "--tar-policy", "lenient", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    stats = json.loads(r.stdout)
    assert stats["samples"] == NSAMPLES and stats["skipped_members"] == 4, stats
    # each worker reads part of the shard and warns what it skipped in its part
    assert NAME in r.stderr and "skipped" in r.stderr, r.stderr


def test_an_unknown_policy_is_a_usage_error(shard: tuple[Path, int]) -> None:
    path, _ = shard
    r = shardkit("inspect", path, "--tar-policy", "loose")
    assert r.returncode == 2 and "loose" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_plan_measures_with_the_policy(shard: tuple[Path, int]) -> None:
    path, at = shard
    r = shardkit("manifest", "from-shards", path.parent, "--tar-policy", "lenient")
    assert r.returncode == 0, r.stderr
    args = ("plan", "--manifest", path.parent / "manifest.json", "--micro-batch", "2")
    args += ("--step-time", "1", "--workers", "0", "--seconds", "1", "--json")
    r = shardkit(*args)
    assert r.returncode == 1, r.stdout + r.stderr
    _refused(r.stderr, at)
    r = shardkit(*args, "--tar-policy", "lenient")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["covered"] is True
    _warned(r.stderr)
