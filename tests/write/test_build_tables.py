"""``shardkit build data/*.parquet``: Hub-style Parquet to shards, split by row groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shardkit.format.manifest.model import Manifest
from tests.helpers.data import tiny_image
from tests.helpers.readback import assert_whole, keys_of, read_samples, shardkit
from tests.write.test_sources_table import hub_table

pytestmark = pytest.mark.integration


def _parquet_files(root: Path) -> list[str]:
    root.mkdir()
    pq.write_table(hub_table(90), root / "train-00000-of-00002.parquet", row_group_size=20)
    pq.write_table(
        hub_table(45, start=90), root / "train-00001-of-00002.parquet", row_group_size=20
    )
    return [str(root / "train-00000-of-00002.parquet"), str(root / "train-00001-of-00002.parquet")]


def test_build_parquet_with_workers_reads_every_row_once(tmp_path: Path) -> None:
    files = _parquet_files(tmp_path / "hub")
    out = tmp_path / "out"
    r = shardkit(
        "build", *files, "-o", out, "--workers", "2", "--maxcount", "40",
        "--field", "text=txt", "--key-field", "id", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 135
    assert_whole(out / "manifest.json")
    samples = read_samples(out / "manifest.json")
    assert sorted(keys_of(samples)) == [f"doc{i:04d}" for i in range(135)]
    s = next(s for s in samples if s["__key__"] == "doc0100")
    assert s["image.png"] == tiny_image(100) and s["text.txt"] == b"caption 100"
    assert s["audio.wav"] == b"RIFF"


def test_parts_split_by_row_groups_and_merge(tmp_path: Path) -> None:
    files = _parquet_files(tmp_path / "hub")
    out = tmp_path / "out"
    for i in range(3):
        r = shardkit("build", *files, "-o", out, "--part", f"{i}/3")
        assert r.returncode == 0, r.stderr
    parts = sorted(out.glob("manifest.part-*-of-0003.json"))
    counts = [Manifest.load(p).total_samples for p in parts]
    assert sum(counts) == 135 and all(counts)  # 7 row groups over 3 parts: each has some
    merged = shardkit("manifest", "merge", *parts, "-o", out / "manifest.json")
    assert merged.returncode == 0, merged.stderr
    keys = keys_of(read_samples(out / "manifest.json"))
    rows = [("train-00000-of-00002", r) for r in range(90)]
    rows += [("train-00001-of-00002", r) for r in range(45)]
    assert keys == [f"{stem}/{r:09d}" for stem, r in rows]


def test_without_pyarrow_the_error_names_the_extra(tmp_path: Path) -> None:
    files = _parquet_files(tmp_path / "hub")
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"  # as if pyarrow were not installed
        "from shardkit.cli import main; main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "build", files[0], "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "shardkit[parquet]" in r.stderr
