"""s3:// reads against moto's S3 server (server mode, on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import make_opener, opener_for
from shardkit.errors import ChecksumError, FetchError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.readback import files_under, read_samples
from tests.helpers.servers import moto_server

pytestmark = pytest.mark.integration

BUCKET = "shardkit-test"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """A boto3 client on moto with test credentials, and an empty bucket."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def shards(make_shards: Callable[..., Manifest], s3: object) -> Manifest:
    m = make_shards([10, 7, 13], tokens=3000, subdir="ds")
    for path, rel in files_under(str(m.base)):
        s3.upload_file(str(path), BUCKET, f"ds/{rel}")  # type: ignore[attr-defined]
    return m


def test_s3_shards_stream_identical(shards: Manifest, endpoint: str) -> None:
    opener = opener_for(IoConfig(endpoint_url=endpoint))
    remote = load_manifest(f"s3://{BUCKET}/ds/manifest.json", opener)
    assert remote.resolve(remote.shards[0].url) == f"s3://{BUCKET}/ds/{shards.shards[0].url}"
    assert read_samples(remote, opener) == read_samples(shards, make_opener())
    entry = shards.shards[1]
    local = (Path(str(shards.base)) / entry.url).read_bytes()
    url = f"s3://{BUCKET}/ds/{entry.url}"
    assert opener.read(url, start=1000, end=5000) == local[1000:5000]
    assert opener.read(url, start=entry.size - 10, end=entry.size + 100) == local[-10:]
    stats = opener.stats()
    assert stats["requests"] == 1 + 3 + 2


def test_s3_through_the_cache(shards: Manifest, endpoint: str, tmp_path: Path) -> None:
    opener = opener_for(
        IoConfig(endpoint_url=endpoint, cache=CacheConfig(cache_dir=tmp_path / "cache"))
    )
    remote = load_manifest(f"s3://{BUCKET}/ds/manifest.json", opener)
    want = read_samples(shards, make_opener())
    assert read_samples(remote, opener) == want
    assert opener.stats()["cache_misses"] == 3
    again = opener_for(
        IoConfig(endpoint_url=endpoint, cache=CacheConfig(cache_dir=tmp_path / "cache"))
    )
    remote = load_manifest(f"s3://{BUCKET}/ds/manifest.json", again)
    assert read_samples(remote, again) == want
    stats = again.stats()
    assert stats["cache_hits"] == 3 and stats.get("requests", 0) == 0


def test_s3_endpoint_from_the_environment(
    shards: Manifest, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    opener = make_opener()
    remote = load_manifest(f"s3://{BUCKET}/ds/manifest.json", opener)
    assert len(read_samples(remote, opener)) == shards.total_samples


def test_s3_missing_key_and_corrupt_object(shards: Manifest, endpoint: str, s3: object) -> None:
    opener = opener_for(IoConfig(endpoint_url=endpoint))
    with pytest.raises(FetchError) as info:
        opener.read(f"s3://{BUCKET}/ds/missing.tar")
    assert info.value.status == 404 and "missing.tar" in str(info.value)
    entry = shards.shards[0]
    data = bytearray((Path(str(shards.base)) / entry.url).read_bytes())
    data[777] ^= 1
    s3.put_object(Bucket=BUCKET, Key=f"ds/{entry.url}", Body=bytes(data))  # type: ignore[attr-defined]
    url = f"s3://{BUCKET}/ds/{entry.url}"
    with (
        pytest.raises(ChecksumError),
        opener.open(ObjectRef(url, entry.size, entry.checksum)) as f,
    ):
        f.read()
