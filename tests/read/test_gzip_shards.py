"""``.tar.gz`` / ``.tgz`` shards read wherever shards are read: adopt, verify, inspect, stream,
re-shard (the shards here are gzipped by Python's gzip, as a public data set would be)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ShardFormatError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.reader import read_shard
from tests.helpers.data import make_shards
from tests.helpers.readback import read_samples, shardkit
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


def _gzipped(tmp_path: Path, sizes: list[int]) -> tuple[Path, list[str]]:
    """Shards of ``sizes`` samples, gzipped (the first as .tgz, the others .tar.gz)."""
    made = make_shards(tmp_path / "plain", sizes)
    out = tmp_path / "gz"
    out.mkdir()
    keys = []
    for i, s in enumerate(made.shards):
        src = tmp_path / "plain" / s.url
        keys += [str(x["__key__"]) for x in read_shard(src)]
        name = s.url.replace(".tar", ".tgz" if i == 0 else ".tar.gz")
        (out / name).write_bytes(gzip.compress(src.read_bytes(), mtime=0))
    return out, keys


def test_adopt_verify_inspect_and_stream_gzip_shards(tmp_path: Path) -> None:
    out, keys = _gzipped(tmp_path, [5, 9, 4])
    r = shardkit("manifest", "from-shards", out, "--json")
    assert r.returncode == 0, r.stderr
    m = Manifest.load(out / "manifest.json")
    assert [s.url for s in m.shards] == [
        "data-000000.tgz",
        "data-000001.tar.gz",
        "data-000002.tar.gz",
    ]
    assert [s.nsamples for s in m.shards] == [5, 9, 4]
    assert [str(s["__key__"]) for s in read_samples(out / "manifest.json")] == keys
    deep = shardkit("verify", out / "manifest.json", "--deep")
    assert deep.returncode == 0, deep.stdout + deep.stderr
    inspect = shardkit("inspect", out / "data-000001.tar.gz", "--json")
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["samples"] == 9
    # streamed with splits: a split of a gzip shard starts from a decompressed offset
    ranks = [
        sk.ShardDataset(str(out / "manifest.json"), seed=1).split_by_node(rank=r, world_size=2)
        for r in range(2)
    ]
    got = [[str(s["__key__"]) for s in ds] for ds in ranks]
    assert len(got[0]) == len(got[1]) == 9
    assert sorted(got[0] + got[1]) == sorted(keys)


def test_gzip_shards_stream_over_http(tmp_path: Path) -> None:
    out, keys = _gzipped(tmp_path, [6, 7])
    assert shardkit("manifest", "from-shards", out).returncode == 0
    with RangeServer(out) as server:
        ds = sk.ShardDataset(server.url("manifest.json"), cache_dir=str(tmp_path / "cache"))
        assert sorted(str(s["__key__"]) for s in ds) == sorted(keys)


def test_reshard_gzip_shards(tmp_path: Path) -> None:
    out, keys = _gzipped(tmp_path, [3, 4])
    r = shardkit(
        "build", out / "data-000001.tar.gz", out / "data-000000.tgz", "-o", tmp_path / "re"
    )
    assert r.returncode == 0, r.stderr
    got = [str(s["__key__"]) for s in read_samples(tmp_path / "re" / "manifest.json")]
    assert sorted(got) == sorted(keys)


def test_a_gzip_shard_named_tar_is_read_whole_and_named_in_a_ranged_read(tmp_path: Path) -> None:
    made = make_shards(tmp_path / "s", [4, 4])
    p = tmp_path / "s" / made.shards[1].url
    p.write_bytes(gzip.compress(p.read_bytes()))
    assert shardkit("manifest", "from-shards", tmp_path / "s").returncode == 0
    assert len(read_samples(tmp_path / "s" / "manifest.json")) == 8  # by magic bytes
    ds = sk.ShardDataset(str(tmp_path / "s" / "manifest.json"))
    with pytest.raises(ShardFormatError, match="gzip-compressed, but its name") as info:
        list(ds)
    assert info.value.url is not None and info.value.url.endswith(made.shards[1].url)
