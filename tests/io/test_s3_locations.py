"""One ``s3://`` url on two stores is two objects: what a node keeps of a remote manifest (its
copy, its compact form) is named by the full location (endpoint, region, profile, bucket,
key), never by the url's text. Two moto servers on 127.0.0.1, one cache dir."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import ShardDataset, WebLoader
from shardkit.cache import opener_for
from shardkit.cli import cli
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig
from shardkit.io.config import IoConfig
from tests.helpers.readback import files_under
from tests.helpers.servers import moto_process

pytestmark = pytest.mark.integration

BUCKET = "same-bucket"
URL = f"s3://{BUCKET}/ds/manifest.json"


@pytest.fixture
def stores(
    make_shards: Callable[..., Manifest], monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[tuple[str, Manifest]]]:
    """Two moto servers, each holding another data set under the same bucket and keys."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto_process() as one, moto_process() as two:
        out = []
        for endpoint, sizes, seed in ((one, [3, 4, 5], 1), (two, [6, 2], 2)):
            m = make_shards(sizes, subdir=f"seed{seed}", seed=seed)
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=BUCKET)
            for path, rel in files_under(str(m.base)):
                client.upload_file(str(path), BUCKET, f"ds/{rel}")
            out.append((endpoint, m))
        yield out


def _read(source: str | Manifest, io: IoConfig | None = None) -> list[tuple[str, bytes]]:
    ds = ShardDataset(source, io=io, shardshuffle=False).to_tuple("__key__", "tokens.npy")
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    return sorted((str(k), bytes(v)) for k, v in loader)


def _samples(endpoint: str, cache_dir: Path) -> list[tuple[str, bytes]]:
    return _read(URL, IoConfig(endpoint_url=endpoint, cache=CacheConfig(cache_dir=str(cache_dir))))


def _local(m: Manifest) -> list[tuple[str, bytes]]:
    return _read(m)


def test_one_url_on_two_stores_with_one_cache_dir_gives_each_store_its_own_data(
    stores: list[tuple[str, Manifest]], tmp_path: Path
) -> None:
    cache = tmp_path / "node"
    (one, m1), (two, m2) = stores
    assert _samples(one, cache) == _local(m1)
    assert _samples(two, cache) == _local(m2)  # the same url, the other store's data set
    assert _samples(one, cache) == _local(m1)
    # the node's manifest copy, asked for directly (the first store's copy is fresh)
    for endpoint, m in stores:
        opener = opener_for(IoConfig(endpoint_url=endpoint, cache=CacheConfig(cache_dir=cache)))
        assert Manifest.loads(opener.fetch_manifest(URL)).total_samples == m.total_samples


def test_cache_warm_fetches_each_stores_data_set(
    stores: list[tuple[str, Manifest]], tmp_path: Path
) -> None:
    cache = str(tmp_path / "node")
    for endpoint, m in (*stores, *stores):
        args = ["cache", "warm", URL, "--cache-dir", cache, "--endpoint-url", endpoint, "--json"]
        warm = CliRunner().invoke(cli, [*args, "--no-shuffle"])
        assert warm.exit_code == 0, warm.output
        summary = json.loads(warm.output)["summary"]
        assert summary["shards"] == len(m.shards)
        assert summary["fetched"] + summary["cached"] == len(m.shards)
