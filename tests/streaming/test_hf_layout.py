"""The directory layout Hugging Face ``datasets`` loads as it is (issue 20): a shard's sample
index lies in the hidden ``.index/`` folder and ``.huggingface.yaml`` names the shards, so
``load_dataset(<shard dir>)`` gives every sample once, whoever wrote the set (the CLI with
one or more workers, ``ShardWriter``, ``manifest from-shards``). Data sets written before
(indexes beside the shards) still stream, verify, resume and are replaced by ``--overwrite``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.format.layout import (
    HF_CONFIG,
    hf_data_files,
    index_name,
    legacy_index_name,
    write_hf_config,
)
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.manifest.model import Manifest
from shardkit.read.shards import load_catalog
from tests.helpers.data import make_samples, make_shards
from tests.helpers.readback import read_samples, shardkit

pytestmark = pytest.mark.integration


def _load(hf: Any, directory: Path, cache: Path) -> list[dict[str, Any]]:
    """Every row ``load_dataset(directory)`` gives, as a user calls it."""
    ds = hf.load_dataset(str(directory), split="train", cache_dir=str(cache))
    return [dict(row) for row in ds]


def _raw_tree(root: Path, n: int) -> dict[str, tuple[bytes, dict[str, int]]]:
    """A folder source of ``n`` samples (``a/sNN.bin`` + ``a/sNN.json``); what each holds."""
    rng = random.Random(20)
    (root / "a").mkdir(parents=True)
    want = {}
    for i in range(n):
        data = rng.randbytes(rng.randrange(1, 3000))
        (root / "a" / f"s{i:02d}.bin").write_bytes(data)
        (root / "a" / f"s{i:02d}.json").write_text(json.dumps({"i": i}))
        want[f"a/s{i:02d}"] = (data, {"i": i})
    return want


def _indexes_in_hidden_folder(out: Path, m: Manifest) -> None:
    assert not list(out.glob("*.idx")), "no index beside the shards"
    assert [s.index for s in m.shards] == [index_name(s.url) for s in m.shards]
    assert sorted(p.name for p in (out / ".index").iterdir()) == sorted(
        s.url + ".idx" for s in m.shards
    )


@pytest.mark.parametrize(("maxcount", "workers", "nshards"), [(50, 1, 1), (7, 1, 3), (7, 2, 4)])
def test_a_cli_build_loads_as_a_hf_directory(
    hf: Any, tmp_path: Path, maxcount: int, workers: int, nshards: int
) -> None:
    """One shard too: beside manifest.json and its compact form, ``datasets``' vote on the
    extensions alone took the directory for JSON."""
    want = _raw_tree(tmp_path / "raw", 20)
    out = tmp_path / "out"
    r = shardkit("build", tmp_path / "raw", "-o", out, "--maxcount", str(maxcount),
                 "--workers", str(workers))  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = Manifest.load(out / "manifest.json")
    assert len(m.shards) == nshards
    _indexes_in_hidden_folder(out, m)
    rows = _load(hf, out, tmp_path / "hf-cache")
    assert sorted(row["__key__"] for row in rows) == sorted(want)  # every sample once
    for row in rows:
        assert (row["bin"], row["json"]) == want[row["__key__"]]
    assert shardkit("verify", out / "manifest.json", "--deep").returncode == 0


@pytest.mark.parametrize("sizes", [[5], [3, 4, 2]])
def test_a_shard_writer_set_loads_as_a_hf_directory(
    hf: Any, tmp_path: Path, sizes: list[int]
) -> None:
    m = make_shards(tmp_path / "s", sizes)
    _indexes_in_hidden_folder(tmp_path / "s", m)
    ours = {str(s["__key__"]): s for s in read_samples(tmp_path / "s" / "manifest.json")}
    rows = _load(hf, tmp_path / "s", tmp_path / "hf-cache")
    assert sorted(row["__key__"] for row in rows) == sorted(ours)
    for row in rows:
        sample = ours[row["__key__"]]
        assert row["json"] == json.loads(sample["json"])
        tokens = np.load(io.BytesIO(sample["tokens.npy"]))
        assert list(row["tokens.npy"]) == tokens.tolist()
    # ShardDataset and inspect on the new layout
    keys = [s["__key__"] for s in sk.ShardDataset(str(tmp_path / "s" / "manifest.json"))]
    assert sorted(keys) == sorted(ours)
    r = shardkit("inspect", tmp_path / "s" / "manifest.json")
    n = len(sizes)
    assert f"sample indexes: {n} of {n} shard{'s' if n != 1 else ''}\n" in r.stdout, r.stdout


def _to_old_layout(directory: Path) -> Manifest:
    """What a build before ``.index/`` left: each index beside its shard (the manifest
    says so), no ``.huggingface.yaml``; made from the current writer's output by moving files."""
    m = Manifest.load(directory / "manifest.json")
    for s in m.shards:
        assert s.index is not None
        os.replace(directory / s.index, directory / legacy_index_name(s.url))
    m.shards = [dataclasses.replace(s, index=legacy_index_name(s.url)) for s in m.shards]
    (directory / ".index").rmdir()
    save_manifest(m, str(directory / "manifest.json"))
    (directory / HF_CONFIG).unlink()
    return Manifest.load(directory / "manifest.json")


def test_an_old_layout_still_streams_verifies_and_is_counted(tmp_path: Path) -> None:
    d = tmp_path / "old"
    make_shards(d, [6, 5, 4])
    m = _to_old_layout(d)
    assert sorted(p.name for p in d.glob("*.idx")) == [s.url + ".idx" for s in m.shards]
    keys = [str(s["__key__"]) for s in sk.ShardDataset(str(d / "manifest.json"))]
    assert sorted(keys) == [f"sample-{i:08d}" for i in range(15)]
    assert shardkit("verify", d / "manifest.json", "--deep").returncode == 0
    inspected = shardkit("inspect", d / "manifest.json")
    assert "sample indexes: 3 of 3 shards" in inspected.stdout, inspected.stdout
    # a url list (no manifest) finds the index beside the shard, as before
    infos = load_catalog([str(d / s.url) for s in m.shards], make_opener())
    assert [(i.nsamples, i.index_url) for i in infos] == [
        (s.nsamples, str(d / legacy_index_name(s.url))) for s in m.shards
    ]
    # the deep check reads the old index where the manifest says: a changed byte is found
    idx = d / legacy_index_name(m.shards[1].url)
    idx.write_bytes(idx.read_bytes()[:-1] + bytes([idx.read_bytes()[-1] ^ 1]))
    bad = shardkit("verify", d / "manifest.json", "--deep")
    assert bad.returncode == 1 and m.shards[1].url in bad.stdout, bad.stdout


def test_resuming_an_old_layout_set_adds_new_layout_shards(hf: Any, tmp_path: Path) -> None:
    """The shards already there keep their indexes beside them (the manifest names them); the
    new ones go to ``.index/``; ``.huggingface.yaml`` then makes the directory load."""
    d = tmp_path / "old"
    make_shards(d, [6, 5])
    _to_old_layout(d)
    with sk.ShardWriter(str(d), maxcount=4, resume=True) as w:
        assert w.resumed_samples == 11
        for sample in make_samples(7, start=11):
            w.write(sample)
    m = Manifest.load(d / "manifest.json")
    assert [s.index for s in m.shards] == [legacy_index_name(s.url) for s in m.shards[:2]] + [
        index_name(s.url) for s in m.shards[2:]
    ]
    want = [f"sample-{i:08d}" for i in range(18)]
    assert sorted(str(s["__key__"]) for s in sk.ShardDataset(str(d / "manifest.json"))) == want
    assert shardkit("verify", d / "manifest.json", "--deep").returncode == 0
    assert sorted(row["__key__"] for row in _load(hf, d, tmp_path / "hf-cache")) == want


def test_overwrite_removes_old_and_new_layout_indexes(hf: Any, tmp_path: Path) -> None:
    want = _raw_tree(tmp_path / "raw", 12)
    old = tmp_path / "out"
    make_shards(old, [4, 4, 4])
    _to_old_layout(old)
    r = shardkit("build", tmp_path / "raw", "-o", old, "--overwrite", "--maxcount", "5")
    assert r.returncode == 0, r.stderr
    m = Manifest.load(old / "manifest.json")
    _indexes_in_hidden_folder(old, m)  # the old indexes beside the shards are gone
    r = shardkit("build", tmp_path / "raw", "-o", old, "--overwrite", "--maxcount", "50")
    assert r.returncode == 0, r.stderr
    m = Manifest.load(old / "manifest.json")
    assert len(m.shards) == 1
    _indexes_in_hidden_folder(old, m)  # and the stale ones of shards 1, 2 in .index/
    assert sorted(p.name for p in old.glob("*.tar")) == ["data-000000.tar"]
    rows = _load(hf, old, tmp_path / "hf-cache")
    assert sorted(row["__key__"] for row in rows) == sorted(want)


def test_from_shards_writes_the_new_layout(hf: Any, tmp_path: Path) -> None:
    d = tmp_path / "s"
    made = make_shards(d, [3, 4, 2])
    for name in ("manifest.json", "manifest.csv", "manifest.json.cols", HF_CONFIG):
        (d / name).unlink()
    for p in (d / ".index").iterdir():
        p.unlink()
    r = shardkit("manifest", "from-shards", d)
    assert r.returncode == 0, r.stderr
    m = Manifest.load(d / "manifest.json")
    assert [s.checksum for s in m.shards] == [s.checksum for s in made.shards]
    _indexes_in_hidden_folder(d, m)
    assert shardkit("verify", d / "manifest.json", "--deep").returncode == 0
    rows = _load(hf, d, tmp_path / "hf-cache")
    assert sorted(row["__key__"] for row in rows) == [f"sample-{i:08d}" for i in range(9)]


def test_an_old_layout_shard_set_inside_an_input_tree_is_not_packed(tmp_path: Path) -> None:
    want = _raw_tree(tmp_path / "raw", 5)
    make_shards(tmp_path / "raw" / "set", [3, 3])
    _to_old_layout(tmp_path / "raw" / "set")
    r = shardkit("build", tmp_path / "raw", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    got = read_samples(tmp_path / "out" / "manifest.json")
    assert sorted(str(s["__key__"]) for s in got) == sorted(want)


def test_index_names_and_the_hf_config(tmp_path: Path) -> None:
    assert index_name("data-000001.tar") == ".index/data-000001.tar.idx"
    assert index_name("a/b/x.tar.gz") == "a/b/.index/x.tar.gz.idx"
    assert index_name("https://h/d/x.tar") == "https://h/d/.index/x.tar.idx"
    assert legacy_index_name("a/x.tar") == "a/x.tar.idx"
    urls = ["d-000000.tar", "d-000001.tar", "sub/e-000000.tar.gz", "odd[1].tar",
            "z-000000.tar.zst", "https://h/x-000000.tar", "/abs/y-000000.tar",
            "../up-000000.tar"]  # fmt: skip
    assert hf_data_files(urls) == ["d-*.tar", "sub/e-*.tar.gz", "odd[[]1].tar"]
    write_hf_config(str(tmp_path), ["https://h/x-000000.tar"])  # nothing local: no file
    assert not (tmp_path / HF_CONFIG).exists()
    write_hf_config(str(tmp_path), ["d-000000.tar"])
    assert '- "d-*.tar"' in (tmp_path / HF_CONFIG).read_text()
    (tmp_path / HF_CONFIG).write_text("configs: []  # the user's own\n")
    write_hf_config(str(tmp_path), ["d-000000.tar"])
    assert (tmp_path / HF_CONFIG).read_text() == "configs: []  # the user's own\n"
