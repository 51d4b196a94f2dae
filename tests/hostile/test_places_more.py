"""Hostile places, more: the folder a build wrote is its manifest to the readers too
(``IndexedShards(DIR)`` and iterating ``ShardDataset(DIR)`` said "cannot open: Is a
directory"), and a folder without one is a ManifestError naming ``DIR/manifest.json``."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ManifestError


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
