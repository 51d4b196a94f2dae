"""Hostile places: a signed url's secret (a presigned query string, a token) never reaches an
error, whatever entry reads it (ShardDataset, IndexedShards, verify, the CLI), against the
HTTP Range server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.cli import main
from tests.helpers.servers import RangeServer

SIGNED = "?X-Amz-Credential=AKIA0SECRETCRED&X-Amz-Signature=0SECRETSIG&token=0SECRETTOK"
SECRETS = ("0SECRETCRED", "0SECRETSIG", "0SECRETTOK")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    root = tmp_path_factory.mktemp("served")
    with sk.ShardWriter(root / "set") as w:
        for i in range(3):
            w.write({"__key__": f"{i:04d}", "txt": f"s{i}"})
    with RangeServer(root) as srv:
        yield srv


def _said(exc: BaseException) -> str:
    text = f"{exc} {exc!r} {exc.args!r}"
    cause = exc.__cause__ or exc.__context__
    return text + (_said(cause) if cause is not None else "")


READERS: dict[str, Callable[[str], Any]] = {
    "ShardDataset": lambda url: list(sk.ShardDataset(url)),
    "IndexedShards": lambda url: sk.IndexedShards(url)[0],
    "verify": sk.verify,
}


@pytest.mark.parametrize("entry", sorted(READERS))
def test_a_signed_url_that_fails_names_no_secret(server: RangeServer, entry: str) -> None:
    url = server.url("gone/manifest.json") + SIGNED
    with pytest.raises(sk.ShardkitError) as info:
        READERS[entry](url)
    said = _said(info.value)
    assert "gone/manifest.json" in said  # the place is still named
    assert not [s for s in SECRETS if s in said], said


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_the_cli_names_no_secret(
    server: RangeServer, command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, server.url("gone/manifest.json") + SIGNED])
    out = capsys.readouterr()
    assert info.value.code != 0
    assert "gone/manifest.json" in out.err
    assert not [s for s in SECRETS if s in out.out + out.err], out
