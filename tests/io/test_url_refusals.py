"""Every reader splits a remote url with the one parser (``shardkit.urls.parse_url``): a url
that names another place than it says is refused before any request, and a credential in a
url reaches no message or log. Real readers against the Range server and moto."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from tests.helpers.servers import RangeServer, moto_server

pytestmark = pytest.mark.integration

SECRET = "hunter2SECRET"


@pytest.fixture
def server(make_shards: Callable[..., Manifest]) -> Iterator[RangeServer]:
    m = make_shards([3], subdir="ds")
    with RangeServer(str(m.base)) as srv:
        yield srv


@pytest.mark.parametrize("path", ["a/../manifest.json", "a//manifest.json", "x.tar#frag"])
def test_http_urls_naming_another_place_are_refused_unasked(server: RangeServer, path: str) -> None:
    with pytest.raises(ConfigError, match="refusing url"):
        make_opener().read(server.url(path))
    assert server.requests() == []


def test_credentials_in_an_http_url_reach_no_message(
    server: RangeServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.url("manifest.json").replace("http://", f"http://user:{SECRET}@")
    caplog.set_level(logging.DEBUG)
    for read in (lambda: make_opener().read(url), lambda: list(sk.ShardDataset(url))):
        with pytest.raises(ConfigError) as info:
            read()
        assert SECRET not in f"{info.value} {info.value!r}"
    assert SECRET not in caplog.text
    assert server.requests() == []


def test_s3_urls_are_read_as_the_key_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bkt-urls")
        client.put_object(Bucket="bkt-urls", Key="exp#2/x.bin", Body=b"hash")
        client.put_object(Bucket="bkt-urls", Key="exp/x.bin", Body=b"plain")
        client.put_object(Bucket="bkt-urls", Key="exp%232/x.bin", Body=b"encoded")
        opener = make_opener()
        assert opener.read("s3://bkt-urls/exp/x.bin") == b"plain"
        assert opener.read("s3://bkt-urls/exp%232/x.bin") == b"encoded"  # the key as written
        for url in (
            "s3://bkt-urls/exp#2/x.bin",
            "s3://bkt-urls/exp?2/x.bin",
            "s3://bkt-urls/a/../exp/x.bin",
        ):
            with pytest.raises(ConfigError, match="refusing url"):
                opener.read(url)
        with pytest.raises(ConfigError) as info:
            opener.read(f"s3://AKIA:{SECRET}/x@bkt-urls/exp/x.bin")
        assert SECRET not in str(info.value)
