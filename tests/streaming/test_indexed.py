"""IndexedShards: sample i and sample by key, local and remote, under torch's samplers."""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

import shardkit as sk
from shardkit.cli import cli
from shardkit.errors import ChecksumError, ConfigError, ManifestError, ShardFormatError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.io import load_manifest
from tests.helpers.readback import files_under, keys_of, read_samples
from tests.helpers.servers import Fault, RangeServer, moto_server, s3_bucket

MakeShards = Callable[..., Manifest]


def _path(m: Manifest) -> str:
    return str(Path(str(m.base)) / "manifest.json")


def _keys(batch: Any) -> list[str]:
    return list(batch)


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def test_every_position_gives_the_sample_a_sequential_read_gives(make_shards: MakeShards) -> None:
    m = make_shards([3, 5, 0, 4, 1])
    want = read_samples(m)
    ds = sk.IndexedShards(_path(m))
    assert len(ds) == len(want) == 13
    for i in [*range(13), *range(-13, 0)]:
        got = ds[i]
        assert got["__key__"] == want[i]["__key__"]
        assert got["json"] == want[i]["json"] and got["tokens.npy"] == want[i]["tokens.npy"]
    for bad in (13, -14):
        with pytest.raises(IndexError, match="out of range for 13"):
            ds[bad]
    view = ds[2:11:3]
    assert len(view) == 3 and view.position(1) == 5
    assert [view[i]["__key__"] for i in range(3)] == keys_of(want)[2:11:3]
    assert view[1:][0]["__key__"] == want[5]["__key__"]  # a view of a view
    assert ds.counters()["samples"] == 26


def test_the_stage_vocabulary_applies_per_sample(make_shards: MakeShards) -> None:
    m = make_shards([4, 4])
    ds = sk.IndexedShards(_path(m)).decode().to_tuple("__key__", "json", "tokens.npy")
    key, record, tokens = ds[6]
    assert key == "sample-00000006" and record == {"id": 6, "text": "document 6"}
    assert tokens.dtype.name == "int32" and tokens.shape == (64,)
    ids = sk.IndexedShards(_path(m)).decode().map(lambda s: s["json"]["id"])
    assert [ids[i] for i in range(8)] == list(range(8))


def test_get_by_key_builds_the_key_index_once_beside_the_manifest(
    make_shards: MakeShards,
) -> None:
    m = make_shards([5, 7, 3])
    ds = sk.IndexedShards(_path(m)).decode()
    assert ds.get("sample-00000009")["json"]["id"] == 9
    assert ds.index_of("sample-00000014") == 14
    with pytest.raises(KeyError):
        ds.get("sample-00000015")
    assert ds.get("nope", None) is None
    table = Path(_path(m) + ".keys")
    stamp = table.stat().st_mtime_ns, table.stat().st_ino
    again = sk.IndexedShards(_path(m))
    assert again.get("sample-00000000")["__key__"] == "sample-00000000"
    assert (table.stat().st_mtime_ns, table.stat().st_ino) == stamp, "the index was built again"
    view = again[10:]
    assert view.index_of("sample-00000012") == 2
    assert view.get("sample-00000003", "outside") == "outside"


def test_a_damaged_or_stale_key_index_is_built_again(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    m = make_shards([4, 4], subdir="a")
    table = Path(_path(m) + ".keys")
    sk.IndexedShards(_path(m)).key_index()
    data = bytearray(table.read_bytes())
    data[-3] ^= 0xFF
    table.write_bytes(bytes(data))
    assert sk.IndexedShards(_path(m)).get("sample-00000005")["__key__"] == "sample-00000005"
    # another data set's index under this name (its content differs) is not believed
    other = make_shards([2, 3], subdir="b", seed=1)
    other_table = Path(_path(other) + ".keys")
    sk.IndexedShards(_path(other)).key_index()
    os.replace(other_table, table)
    assert sk.IndexedShards(_path(m)).index_of("sample-00000007") == 7


def test_random_and_distributed_samplers_with_workers_see_every_sample_once(
    make_shards: MakeShards,
) -> None:
    m = make_shards([6, 9, 5])
    ds = sk.IndexedShards(_path(m)).map(_key)
    want = sorted(keys_of(read_samples(m)))
    assert pickle.loads(pickle.dumps(ds))[3] == want[3]
    gen = torch.Generator().manual_seed(3)
    loader = DataLoader(
        ds,
        sampler=RandomSampler(ds, generator=gen),
        batch_size=4,
        num_workers=2,
        collate_fn=_keys,
        multiprocessing_context="spawn",
    )
    seen = [k for batch in loader for k in batch]
    assert sorted(seen) == want and seen != want
    per_rank = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=5)
        per_rank.append([ds[i] for i in sampler])
    assert len(per_rank[0]) == len(per_rank[1]) == 10
    assert sorted(per_rank[0] + per_rank[1]) == want


@pytest.fixture
def served(make_shards: MakeShards) -> Iterator[tuple[Manifest, RangeServer]]:
    m = make_shards([20, 20, 20], tokens=2000, subdir="served", piece_size=16 << 10)
    with RangeServer(str(m.base)) as srv:
        yield m, srv


@pytest.mark.integration
@pytest.mark.parametrize("cached", [True, False])
def test_remote_lookups_read_one_sample_verified(
    served: tuple[Manifest, RangeServer], tmp_path: Path, cached: bool
) -> None:
    m, srv = served
    want = read_samples(m)
    cache = str(tmp_path / "cache") if cached else None
    ds = sk.IndexedShards(srv.url("manifest.json"), cache_dir=cache)
    for i in (45, 3, 59, 22):
        assert ds[i]["tokens.npy"] == want[i]["tokens.npy"]
    assert ds.get("sample-00000031")["__key__"] == "sample-00000031"
    if not cached:  # one sample's pieces, not the shard: a ranged read
        fresh = sk.IndexedShards(srv.url("manifest.json"))
        before = srv.bytes_sent("/data-000001.tar")
        fresh[25]
        got = srv.bytes_sent("/data-000001.tar") - before
        assert 0 < got < m.shards[1].size // 2, got
        key_dir = Path(os.environ["XDG_CACHE_HOME"]) / "shardkit" / "keys"
        assert [p.suffix for p in key_dir.iterdir() if p.suffix == ".keys"] == [".keys"]


@pytest.mark.integration
def test_a_corrupt_remote_sample_is_an_error_never_a_sample(
    served: tuple[Manifest, RangeServer], tmp_path: Path
) -> None:
    m, srv = served
    offsets = read_index((Path(str(m.base)) / index_name("data-000002.tar")).read_bytes())
    at = int(offsets[10]) + 700  # inside sample 10 of the shard: global sample 50
    for cache in (str(tmp_path / "cache"), None):
        ds = sk.IndexedShards(srv.url("manifest.json"), cache_dir=cache)
        srv.faults.append(Fault("/data-000002.tar", "corrupt", times=100, at=at))
        with pytest.raises((ChecksumError, ShardFormatError)):
            ds[50]
        srv.faults.clear()


@pytest.mark.integration
def test_a_remote_shard_without_pieces_is_refused_uncached(
    make_shards: MakeShards,
) -> None:
    m = make_shards([10, 10], subdir="nopieces", piece_size=None)
    with RangeServer(str(m.base)) as srv:
        ds = sk.IndexedShards(srv.url("manifest.json"))
        with pytest.raises(ConfigError, match="cache_dir="):
            ds[13]


@pytest.mark.integration
def test_s3_lookups(make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch) -> None:

    m = make_shards([8, 8], subdir="s3set")
    with moto_server() as endpoint:
        client = s3_bucket(endpoint, "sets", monkeypatch)
        for p, rel in files_under(str(m.base)):
            client.upload_file(str(p), "sets", f"ix/{rel}")
        ds = sk.IndexedShards("s3://sets/ix/manifest.json").decode()
        assert [ds[i]["json"]["id"] for i in (15, 0, 9)] == [15, 0, 9]
        assert ds.get("sample-00000011")["json"]["id"] == 11
        # a prefix (a folder url) is its manifest.json, for every entry point
        assert sk.IndexedShards("s3://sets/ix/").decode()[9]["json"]["id"] == 9
        res = CliRunner().invoke(cli, ["verify", "s3://sets/ix/", "--json"])
        assert res.exit_code == 0, res.output
        with pytest.raises(ManifestError, match=re.escape("s3://sets/none/manifest.json")):
            load_manifest("s3://sets/none/")


@pytest.mark.integration
def test_the_random_access_example_scores_a_held_out_slice(tmp_path: Path) -> None:
    """examples/random_access_eval.py: a slice view through a DataLoader with 2 workers,
    then the worst samples fetched again by key."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "random_access_eval.py"
    r = subprocess.run(
        [sys.executable, str(script), "--data", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["scored"] == 100 and out["first_key"] == "doc-00300"
    assert len(out["worst"]) == 3 and all(k >= "doc-00300" for k in out["worst"])
    truth = sk.IndexedShards(str(tmp_path / "d" / "manifest.json")).decode()
    assert out["worst_labels"] == [truth.get(k)["json"]["label"] for k in out["worst"]]
