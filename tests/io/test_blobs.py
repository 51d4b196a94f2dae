"""gs:// and az:// reads against real emulators on 127.0.0.1: a GCS emulator
(gcp-storage-emulator) and Azurite, through the opener, the cache, ShardDataset, verify
and inspect, as s3:// is read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit._types import ObjectRef
from shardkit.cache import make_opener
from shardkit.cli import cli
from shardkit.errors import ChecksumError, FetchError
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.stores import Store, azurite, gcs_emulator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    emulator = gcs_emulator if request.param == "gs" else azurite
    with emulator() as s:
        yield s


@pytest.fixture
def shards(make_shards: Callable[..., Manifest], store: Store) -> Iterator[Manifest]:
    m = make_shards([10, 7, 13], tokens=3000, subdir="ds")
    store.upload_dir(Path(str(m.base)), "ds")
    yield m
    store.clear()


def test_blob_shards_stream_identical(shards: Manifest, store: Store) -> None:
    opener = make_opener()
    remote = load_manifest(store.url("ds/manifest.json"), opener)
    assert remote.resolve(remote.shards[0].url) == store.url(f"ds/{shards.shards[0].url}")
    assert read_samples(remote, opener) == read_samples(shards, make_opener())
    entry = shards.shards[1]
    local = (Path(str(shards.base)) / entry.url).read_bytes()
    url = store.url(f"ds/{entry.url}")
    assert opener.read(url, start=1000, end=5000) == local[1000:5000]
    assert opener.read(url, start=entry.size - 10, end=entry.size + 100) == local[-10:]
    assert opener.read(url, start=entry.size + 5) == b""
    assert opener.read(url) == local  # to its end, size unknown


def test_blob_through_the_cache_and_the_dataset(
    shards: Manifest, store: Store, tmp_path: Path
) -> None:
    want = read_samples(shards, make_opener())
    ds = sk.ShardDataset(store.url("ds/manifest.json"), cache_dir=tmp_path / "cache")
    got = sorted((s["__key__"], s["tokens.npy"]) for s in ds)
    assert got == sorted((s["__key__"], s["tokens.npy"]) for s in want)
    again = make_opener(cache_dir=tmp_path / "cache")
    remote = load_manifest(store.url("ds/manifest.json"), again)
    assert read_samples(remote, again) == want
    stats = again.stats()
    assert stats["cache_hits"] == 3 and stats.get("requests", 0) == 0


def test_blob_missing_and_corrupt(shards: Manifest, store: Store) -> None:
    opener = make_opener()
    with pytest.raises(FetchError) as info:
        opener.read(store.url("ds/missing.tar"))
    assert info.value.status == 404 and "missing.tar" in str(info.value)
    entry = shards.shards[0]
    data = bytearray((Path(str(shards.base)) / entry.url).read_bytes())
    data[777] ^= 1
    store.put(f"ds/{entry.url}", bytes(data))
    with (
        pytest.raises(ChecksumError),
        opener.open(ObjectRef(store.url(f"ds/{entry.url}"), entry.size, entry.checksum)) as f,
    ):
        f.read()
    res = CliRunner().invoke(cli, ["verify", store.url("ds/manifest.json"), "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert [u.rsplit("/", 1)[-1] for u in report["bad_shards"]] == [entry.url]
    assert {p["kind"] for p in report["problems"]} == {"checksum"}


def test_blob_verify_and_inspect_cli(shards: Manifest, store: Store) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["verify", store.url("ds/manifest.json"), "--deep"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["inspect", store.url("ds/manifest.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["samples"] == shards.total_samples


def test_blob_location_names_the_service(store: Store) -> None:
    """The same url on another service is another location (cache keys, node forms)."""
    from shardkit.io.config import IoConfig
    from shardkit.io.remote import UncachedOpener

    here = UncachedOpener(IoConfig()).location(store.url("ds/manifest.json"))
    assert store.url("ds/manifest.json") in here
    endpoint = next(iter(store.env.values()))
    assert ("127.0.0.1" in here) and (
        endpoint.split("//")[-1].split(";")[0] in here or "127.0.0.1" in endpoint
    )


def test_blob_adopt_and_cache_warm(shards: Manifest, store: Store, tmp_path: Path) -> None:
    """manifest from-shards adopts a gs:// / az:// set in place; cache warm fills the cache
    from it; the adopted manifest streams every sample through the warm cache, no request."""
    runner = CliRunner()
    pattern = store.url("ds/data-{000000..000002}.tar")
    res = runner.invoke(cli, ["manifest", "from-shards", pattern, "-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output + str(res.exception or "")
    adopted = Manifest.load(tmp_path / "a" / "manifest.json")
    assert [e.checksum for e in adopted.shards] == [e.checksum for e in shards.shards]
    assert adopted.shards[0].url == store.url(f"ds/{shards.shards[0].url}")
    cache = tmp_path / "cache"
    manifest = str(tmp_path / "a" / "manifest.json")
    res = runner.invoke(cli, ["cache", "warm", manifest, "--cache-dir", str(cache), "--json"])
    assert res.exit_code == 0, res.output + str(res.exception or "")
    opener = make_opener(cache_dir=cache)
    got = read_samples(load_manifest(manifest, opener), opener)
    assert sorted(s["__key__"] for s in got) == sorted(
        s["__key__"] for s in read_samples(shards, make_opener())
    )
    assert opener.stats()["cache_hits"] == 3 and opener.stats().get("requests", 0) == 0
