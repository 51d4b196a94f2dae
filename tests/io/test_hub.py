"""hf:// urls against a local HTTP server answering the Hub's resolve paths (no network):
the endpoint from HF_ENDPOINT, the token from HF_TOKEN or the stored login, revisions, and
a Hub set streamed, verified and adopted in place."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit._types import ObjectRef
from shardkit.cache import make_opener
from shardkit.cli import cli
from shardkit.errors import ChecksumError, ConfigError, FetchError
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest
from shardkit.io.hub import resolve_hub_url
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


def test_resolve_urls_as_the_hub_spells_them() -> None:
    base = "https://hub.example"
    assert resolve_hub_url("hf://datasets/org/set/a/x.tar", base) == (
        "https://hub.example/datasets/org/set/resolve/main/a/x.tar"
    )
    assert resolve_hub_url("hf://datasets/org/set@v1.0/x.tar", base) == (
        "https://hub.example/datasets/org/set/resolve/v1.0/x.tar"
    )
    assert resolve_hub_url("hf://datasets/org/set@refs%2Fpr%2F3/x.tar", base) == (
        "https://hub.example/datasets/org/set/resolve/refs%2Fpr%2F3/x.tar"
    )
    assert resolve_hub_url("hf://org/model/w.tar", base) == (
        "https://hub.example/org/model/resolve/main/w.tar"
    )
    assert resolve_hub_url("hf://spaces/org/app/f.tar", base).startswith(
        "https://hub.example/spaces/org/app/resolve/main/"
    )
    for bad in ("hf://datasets/org", "hf://datasets/org/set/", "https://x/y"):
        with pytest.raises(ConfigError):
            resolve_hub_url(bad, base)


@pytest.fixture
def hub(
    make_shards: Callable[..., Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RangeServer, Manifest]]:
    m = make_shards([9, 6, 11], tokens=2000, subdir="ds")
    repo = tmp_path / "hub" / "datasets" / "org" / "set" / "resolve"
    shutil.copytree(str(m.base), repo / "main" / "train")
    shutil.copytree(str(m.base), repo / "v2" / "train")
    with RangeServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url("").rstrip("/"))
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        yield server, m


def test_hub_set_streams_through_the_resolve_urls_with_the_token(
    hub: tuple[RangeServer, Manifest], tmp_path: Path
) -> None:
    server, local = hub
    opener = make_opener()
    remote = load_manifest("hf://datasets/org/set/train/manifest.json", opener)
    assert remote.resolve(remote.shards[0].url) == "hf://datasets/org/set/train/data-000000.tar"
    assert read_samples(remote, opener) == read_samples(local, make_opener())
    assert server.log and all(
        r.headers.get("Authorization") == "Bearer hf_test_token" for r in server.log
    )
    assert {r.path.split("/resolve/")[0] for r in server.log} == {"/datasets/org/set"}
    ds = sk.ShardDataset("hf://datasets/org/set@v2/train/manifest.json", cache_dir=tmp_path / "c")
    assert sum(1 for _ in ds) == local.total_samples
    assert any("/resolve/v2/" in r.path for r in server.log)


def test_hub_token_from_the_stored_login(
    hub: tuple[RangeServer, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = hub
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    (tmp_path / "hfhome").mkdir()
    (tmp_path / "hfhome" / "token").write_text("hf_stored\n")
    make_opener().read("hf://datasets/org/set/train/manifest.json")
    assert server.log[-1].headers.get("Authorization") == "Bearer hf_stored"


def test_hub_missing_file_corrupt_shard_verify_and_adopt(
    hub: tuple[RangeServer, Manifest], tmp_path: Path
) -> None:
    server, local = hub
    with pytest.raises(FetchError) as info:
        make_opener().read("hf://datasets/org/set/train/missing.tar")
    assert info.value.status == 404
    runner = CliRunner()
    res = runner.invoke(cli, ["verify", "hf://datasets/org/set/train/manifest.json", "--deep"])
    assert res.exit_code == 0, res.output
    pattern = "hf://datasets/org/set/train/data-{000000..000002}.tar"
    res = runner.invoke(cli, ["manifest", "from-shards", pattern, "-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output + str(res.exception or "")
    adopted = Manifest.load(tmp_path / "a" / "manifest.json")
    assert [e.checksum for e in adopted.shards] == [e.checksum for e in local.shards]
    shard = Path(str(server.root)) / "datasets/org/set/resolve/main/train/data-000001.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    shard.write_bytes(bytes(data))
    entry = local.shards[1]
    url = "hf://datasets/org/set/train/data-000001.tar"
    opener = make_opener()
    with (
        pytest.raises(ChecksumError),
        opener.open(ObjectRef(url, entry.size, entry.checksum)) as f,
    ):
        f.read()
