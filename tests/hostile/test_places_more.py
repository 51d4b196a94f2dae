"""Hostile places, more: the folder a build wrote is its manifest to the readers too
(``IndexedShards(DIR)`` and iterating ``ShardDataset(DIR)`` said "cannot open: Is a
directory"), and a folder without one is a ManifestError naming ``DIR/manifest.json``; a
folder of JSONL files with an ``x.csv`` beside them is a usage error naming it (it was
packed as a file tree, each file one sample, exit 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit.cli import cli
from shardkit.errors import ConfigError, ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.write.writer.object_lock import LEASE
from tests.helpers.readback import shardkit, write_jsonl
from tests.helpers.stores import object_store


def _built(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    with sk.ShardWriter(out) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "txt": f"t{i}"})
    return out


@pytest.mark.parametrize("as_path", [False, True])
def test_the_output_folder_reads_as_its_manifest(tmp_path: Path, as_path: bool) -> None:
    out = _built(tmp_path)
    given = out if as_path else str(out)
    ds = sk.IndexedShards(given)
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["k0", "k1", "k2"]
    keys = sorted(s["__key__"] for s in sk.ShardDataset(given, shardshuffle=False))
    assert keys == ["k0", "k1", "k2"]


@pytest.mark.parametrize("reader", ["indexed", "dataset"])
def test_a_folder_without_a_manifest_names_where_it_should_be(tmp_path: Path, reader: str) -> None:
    out = _built(tmp_path)
    (out / "manifest.json").unlink()
    with pytest.raises(ManifestError) as info:
        if reader == "indexed":
            sk.IndexedShards(str(out))
        else:
            list(sk.ShardDataset(str(out)))
    assert str(out / "manifest.json") in str(info.value)


def _records_and_a_table(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for n in range(3):
        (src / f"part{n}.jsonl").write_text(
            "".join(json.dumps({"text": f"t{n}-{i}"}) + "\n" for i in range(2))
        )
    (src / "x.csv").write_text("a,b\n1,2\n")
    (src / "README.md").write_text("# card\n")
    return src


def test_records_with_a_stray_file_are_refused_naming_it_cli(tmp_path: Path) -> None:
    src = _records_and_a_table(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["build", str(src), "-o", str(out)])
    assert res.exit_code == 2, res.output  # a usage error, not a file tree of 5 samples
    assert "x.csv" in res.output and "--exclude '*.csv'" in res.output, res.output
    assert not (out / "manifest.json").exists()
    # the way out it names works: the stray left out, the folder is read as records
    res = CliRunner().invoke(cli, ["build", str(src), "-o", str(out), "--exclude", "*.csv"])
    assert res.exit_code == 0, res.output
    assert Manifest.load(out / "manifest.json").total_samples == 6


def test_records_with_a_stray_file_are_refused_naming_it_api(tmp_path: Path) -> None:
    src = _records_and_a_table(tmp_path)
    with pytest.raises(ConfigError, match=r"x\.csv"):
        sk.build([str(src)], str(tmp_path / "out"), progress=False)
    # asked for a file tree, it is one: every file a sample
    res = sk.build([str(src)], str(tmp_path / "tree"), progress=False, source_type="files")
    assert res.manifest.total_samples == 5


def test_a_stale_store_lock_is_announced_once(tmp_path: Path) -> None:
    """A killed build's lock objects (one per lock: the manifest's and the shards') are
    taken over with one line each (it said each one twice)."""
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", ({"id": f"k{i}", "text": "x"} for i in range(3)))
    gone = {"pid": 1, "host": "another-host", "started": 0.0, "renewed": time.time() - LEASE - 60}
    with object_store("s3") as store:
        for key in ("lk/.lock-manifest.json", "lk/.lock-data-shards"):  # what a kill leaves
            store.put(key, json.dumps(gone).encode())
        res = shardkit("build", src, "-o", store.url("lk/"), "--key-field", "id")
        assert res.returncode == 0, res.stderr
        assert res.stderr.count("taking over the stale lock") == 1, res.stderr
        assert not [k for k in store.names() if ".lock-" in k]  # taken over, let go at the end
