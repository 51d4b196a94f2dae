"""A remote folder url (ending in ``/``) opens its ``manifest.json``, as a local folder does,
through every entry point that takes a manifest; the url parser refuses what it refuses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit.cli import cli
from shardkit.errors import ConfigError, FetchError, ManifestError
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest, manifest_source
from tests.helpers.servers import RangeServer

MakeShards = Callable[..., Manifest]


@pytest.mark.parametrize(
    "folder",
    ["http://h:8/s/", "https://h/a/b/", "s3://b/p/", "gs://b/p/", "az://c/p/", "s3://b/"],
)
def test_a_remote_folder_is_its_manifest_json(folder: str) -> None:
    assert manifest_source(folder) == folder + "manifest.json"
    assert manifest_source(folder + "m.json") == folder + "m.json"  # a file stays itself


def test_a_query_ending_in_a_slash_is_no_folder() -> None:
    url = "https://h/s/m.json?sig=a/"
    assert manifest_source(url) == url  # never "...?sig=a/manifest.json"


@pytest.mark.parametrize(
    "folder",
    [
        "s3://KEY:SECRET@b/p/",
        "http://user:pw@h/s/",
        "s3://b/exp#2/",
        "http://h/a/../s/",
        "gs://b/a//",
        "az://c/%2e%2e/",
        "s3:///p/",
    ],
)
def test_a_folder_url_the_parser_refuses_is_refused(folder: str) -> None:
    with pytest.raises(ConfigError):
        manifest_source(folder)


@pytest.mark.integration
def test_every_entry_point_opens_an_http_folder(make_shards: MakeShards) -> None:
    m = make_shards([6, 5], subdir="set")
    with RangeServer(str(m.base)) as srv:
        folder = srv.url("")
        assert folder.endswith("/")
        ds = sk.IndexedShards(folder).decode()
        assert len(ds) == 11
        assert [ds[i]["json"]["id"] for i in (10, 0, 6)] == [10, 0, 6]
        assert sum(1 for _ in sk.ShardDataset(folder)) == 11
        runner = CliRunner()
        res = runner.invoke(cli, ["verify", folder, "--json"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["inspect", folder, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["samples"] == 11


@pytest.mark.integration
def test_an_http_folder_without_a_manifest_names_the_url_tried(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with RangeServer(str(tmp_path)) as srv:
        folder = srv.url("empty/")
        tried = folder + "manifest.json"
        with pytest.raises(ManifestError, match="folder without a manifest") as err:
            load_manifest(folder)
        assert tried in str(err.value)
        with pytest.raises((ManifestError, FetchError), match=re.escape(tried)):
            sk.IndexedShards(folder)
        res = CliRunner().invoke(cli, ["verify", folder])
        assert res.exit_code == 1
        assert tried in res.output
