"""A manifest's folder given with a ``?query`` or ``#fragment`` is refused by name (the
folder is read as its ``manifest.json``, which the suffix would not reach), through the CLI
and the Python API, over HTTP and locally; a ``file://`` url with one is refused too (its
read would drop it); a local name that holds ``?`` or ``#`` is still read as itself."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest, manifest_source
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


@pytest.fixture
def folder(make_shards: Callable[..., Manifest], tmp_path: Path) -> Path:
    make_shards([3, 2], subdir="data")
    return tmp_path / "data"


def _refused_everywhere(source: str, head: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every entry point that takes a manifest refuses ``source`` naming ``head``."""
    for call in (manifest_source, load_manifest, sk.verify, sk.ShardDataset, sk.IndexedShards):
        with pytest.raises(ConfigError, match="follows") as err:
            call(source)
        assert repr(head) in str(err.value), call
    for command in ("verify", "inspect"):  # the installed entry point, its one line
        with pytest.raises(SystemExit) as exit_:
            main([command, source])
        out = capsys.readouterr()
        assert exit_.value.code == 1, out
        assert f"follows {head!r}" in out.err and "Traceback" not in out.err + out.out


@pytest.mark.parametrize("suffix", ["?x=1", "#a", "?", "#"])
def test_an_http_folder_with_a_suffix(
    folder: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with RangeServer(folder.parent) as srv:
        head = srv.url("data/")
        _refused_everywhere(head + suffix, head, capsys)
        if suffix != "?x=1":
            return
        assert sk.verify(head).ok  # the folder alone is its manifest
        assert len(sk.IndexedShards(head + "manifest.json?x=1")) == 5  # a manifest's own url


@pytest.mark.parametrize("suffix", ["?x=1", "#a"])
@pytest.mark.parametrize("form", ["path", "path/", "file://"])
def test_a_local_folder_with_a_suffix(
    folder: Path, suffix: str, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = {"path": str(folder), "path/": f"{folder}/", "file://": f"file://{folder}/"}[form]
    _refused_everywhere(head + suffix, head, capsys)
    assert sk.verify(head).ok


def test_a_file_url_with_a_suffix_is_refused_and_a_local_name_with_one_is_read(
    folder: Path,
) -> None:
    with pytest.raises(ConfigError, match="a file:// url has no query or fragment"):
        load_manifest(f"file://{folder}/manifest.json#x")
    odd = folder.parent / "odd#1"  # a real folder whose name holds '#'
    shutil.copytree(folder, odd)
    assert sk.verify(str(odd)).ok
    assert sk.verify(f"{odd}/manifest.json").ok
    with pytest.raises(ConfigError, match="follows"):
        manifest_source(f"{odd}/#2")  # '#2' after it: refused as the others
