"""``manifest from-shards URL_PATTERN -o DIR``: a remote WebDataset set adopted in place.

The shards stay on a real HTTP server (Range support); DIR gets the manifest and indexes,
and ShardDataset streams the remote shards from it with splits, the cache and resume.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import webdataset as wds

import shardkit as sk
from shardkit.errors import ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import INDEX_MAGIC
from tests.helpers.readback import shardkit
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


def _webdataset_set(root: Path, n: int = 60, maxcount: int = 16) -> list[str]:
    """A set written by webdataset.ShardWriter (a pax header per member), 4 shards."""
    root.mkdir(parents=True)
    with wds.ShardWriter(str(root / "d-%06d.tar"), maxcount=maxcount, verbose=0) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:05d}", "txt": f"text {i}", "cls": i})
    return [f"s{i:05d}" for i in range(n)]


def _keys(ds: sk.ShardDataset) -> list[str]:
    return [str(s["__key__"]) for s in ds]


def test_adopt_then_stream_split_cached_and_resumed(tmp_path: Path) -> None:
    keys = _webdataset_set(tmp_path / "remote")
    out = tmp_path / "adopted"
    with RangeServer(tmp_path / "remote") as server:
        pattern = server.url("d-{000000..000003}.tar")
        r = shardkit("manifest", "from-shards", pattern, "-o", out, "--workers", "3", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["samples"] == 60
        m = Manifest.load(out / "manifest.json")
        assert [s.url for s in m.shards] == [server.url(f"d-{i:06d}.tar") for i in range(4)]
        assert m.origins == (server.url(""),)
        assert sorted(p.name for p in out.glob(".index/*.idx")) == [
            f"d-{i:06d}.tar.idx" for i in range(4)
        ]
        # indexes in the current, bound format (they were SKIDX001: a warning every epoch)
        assert {p.read_bytes()[:8] for p in out.glob(".index/*.idx")} == {INDEX_MAGIC}
        assert len(server.requests("*.tar")) == 4  # each shard read once
        # streamed from the adopted manifest: every sample once over 2 ranks, no flag
        ranks = [
            sk.ShardDataset(
                str(out / "manifest.json"), cache_dir=str(tmp_path / "c"), seed=5
            ).split_by_node(rank=r, world_size=2)
            for r in range(2)
        ]
        got = [_keys(ds) for ds in ranks]
        assert len(got[0]) == len(got[1]) == 30
        assert sorted(got[0] + got[1]) == keys
        # exact resume mid-epoch
        ds = sk.ShardDataset(str(out / "manifest.json"), seed=5)
        it = iter(ds)
        head = [str(s["__key__"]) for s in itertools.islice(it, 23)]
        state = json.loads(json.dumps(ds.state_dict()))
        tail = [str(s["__key__"]) for s in it]
        again = sk.ShardDataset(str(out / "manifest.json"), seed=5)
        again.load_state_dict(state)
        assert _keys(again) == tail and sorted(head + tail) == keys
        verify = shardkit("verify", out / "manifest.json", "--deep")
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_an_adopted_manifest_served_from_elsewhere_is_refused(tmp_path: Path) -> None:
    _webdataset_set(tmp_path / "remote", n=20)
    out = tmp_path / "adopted"
    with RangeServer(tmp_path / "remote") as server:
        pattern = server.url("d-{000000..000001}.tar")
        assert shardkit("manifest", "from-shards", pattern, "-o", out).returncode == 0
        mirror = tmp_path / "mirror"
        shutil.copytree(out, mirror)
        with RangeServer(mirror) as other:  # the same manifest, now read from a url
            ds = sk.ShardDataset(other.url("manifest.json"))
            with pytest.raises(ManifestError, match="outside the manifest's base"):
                _keys(ds)


def test_adopt_names_a_missing_or_broken_shard_and_writes_no_manifest(tmp_path: Path) -> None:
    _webdataset_set(tmp_path / "remote", n=20)
    data = (tmp_path / "remote" / "d-000001.tar").read_bytes()
    (tmp_path / "remote" / "d-000001.tar").write_bytes(data[: len(data) // 2])
    with RangeServer(tmp_path / "remote") as server:
        broken = shardkit(
            "manifest", "from-shards", server.url("d-{000000..000001}.tar"), "-o", tmp_path / "a"
        )
        assert broken.returncode == 1
        assert "d-000001.tar" in broken.stderr and "truncated" in broken.stderr
        assert not (tmp_path / "a" / "manifest.json").exists()
        missing = shardkit(  # the set has two shards: these are all missing
            "manifest", "from-shards", server.url("d-{000002..000009}.tar"), "-o", tmp_path / "b"
        )
        assert missing.returncode == 1 and "404" in missing.stderr
        assert not (tmp_path / "b" / "manifest.json").exists()
        no_out = shardkit("manifest", "from-shards", server.url("d-000000.tar"))
        assert no_out.returncode == 2 and "-o DIR" in no_out.stderr


def test_adopt_from_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    from tests.helpers.servers import moto_server, s3_bucket

    keys = _webdataset_set(tmp_path / "remote", n=30)
    with moto_server() as endpoint:
        client = s3_bucket(endpoint, "sets", monkeypatch)
        for p in sorted((tmp_path / "remote").glob("*.tar")):
            client.upload_file(str(p), "sets", f"wds/{p.name}")
        out = tmp_path / "adopted"
        r = shardkit("manifest", "from-shards", "s3://sets/wds/d-{000000..000001}.tar", "-o", out)
        assert r.returncode == 0, r.stderr
        assert Manifest.load(out / "manifest.json").origins == ("s3://sets/wds/",)
        assert {p.read_bytes()[:8] for p in out.glob(".index/*.idx")} == {INDEX_MAGIC}
        assert sorted(_keys(sk.ShardDataset(str(out / "manifest.json")))) == keys
