"""Hostile: what ``sk.verify``, ``shardkit verify`` and ``shardkit inspect`` say back about
a manifest url that holds a secret (a presigned query string, ``user:secret@``), against
the HTTP Range server.

The errors were redacted (7e0650e), but the report echoed the url as given: ``verify
--json URL?X-Amz-Signature=...`` printed the signature in ``manifest`` (a good set), and
``http://user:secret@host/...`` in ``manifest``, ``bad_shards`` and ``problems[].url``
(an unreadable one); ``sk.verify(url).manifest`` held it too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit.cli import cli
from tests.helpers.servers import RangeServer

SIGNED = "?X-Amz-Credential=AKIA0SECRETCRED&X-Amz-Signature=0SECRETSIG&token=0SECRETTOK"
SECRETS = ("0SECRETCRED", "0SECRETSIG", "0SECRETTOK", "0PASSWORD")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    root = tmp_path_factory.mktemp("served")
    with sk.ShardWriter(root / "set") as w:
        for i in range(3):
            w.write({"__key__": f"{i:04d}", "txt": f"s{i}"})
    with RangeServer(root) as srv:
        yield srv


def _clean(text: str) -> None:
    assert not [s for s in SECRETS if s in text], text


def test_a_presigned_manifest_is_verified_and_its_secret_never_said(server: RangeServer) -> None:
    url = server.url("set/manifest.json") + SIGNED
    report = sk.verify(url)
    assert report.ok
    _clean(report.manifest + json.dumps(report.to_dict()))
    for args in (["verify", "--json", url], ["verify", url]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        _clean(res.output)


@pytest.mark.parametrize(
    "where",
    ["http://user:0PASSWORD@{host}/set/manifest.json", "http://{host}/set/nope.json" + SIGNED],
)
def test_an_unreadable_manifest_is_one_json_problem_without_its_secret(
    server: RangeServer, where: str
) -> None:
    url = where.format(host=server.url("").split("//")[1].rstrip("/"))
    res = CliRunner().invoke(cli, ["verify", "--json", url])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert not out["ok"] and [p["kind"] for p in out["problems"]] == ["manifest"]
    _clean(res.output)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_inspect_never_prints_a_presigned_manifest_urls_secret(
    server: RangeServer, json_flag: list[str]
) -> None:
    """inspect printed the signed url whole ('manifest http://...&X-Amz-Signature=...')."""
    url = server.url("set/manifest.json") + SIGNED
    res = CliRunner().invoke(cli, ["inspect", *json_flag, url])
    assert res.exit_code == 0, res.output
    assert "X-Amz-Signature=***" in res.output
    _clean(res.output)
