"""manifest_source against urls that name something other than what would be read."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

import shardkit as sk
from shardkit import Manifest
from shardkit.io import load_manifest
from tests.helpers.servers import RangeServer


def test_a_file_url_naming_another_host_is_refused(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    """'file://nas/<path>' names a file on the host 'nas'; it was read from this machine's
    disk at <path> (the same set here: another one's data where both exist). Refused by
    every entry, naming the host; 'file://localhost/<path>' and 'file:///<path>' read."""
    make_shards([4, 3], subdir="set")
    path = f"{tmp_path}/set/manifest.json"
    reads: list[Callable[[str], object]] = [
        load_manifest,
        sk.verify,
        lambda u: list(sk.ShardDataset(u)),
        lambda u: len(sk.IndexedShards(u)),
    ]
    for read in reads:
        with pytest.raises(sk.ConfigError, match="'nas' is another host"):
            read(f"file://nas{path}")
        with pytest.raises(sk.ConfigError, match="'nas' is another host"):
            read(f"file://nas{tmp_path}/set/")
    assert len(load_manifest(f"file://localhost{path}")) == len(load_manifest(f"file://{path}"))


def test_a_missing_manifest_in_a_real_folder_named_with_a_hash_is_not_sent_elsewhere(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    """Folders 'set' (a data set) and 'set#v2' (none yet): 'set#v2/manifest.json' was
    refused as "'#v2/manifest.json' follows 'set': give the folder alone ('.../set')",
    advice that reads the other data set. It is the missing file it is, named."""
    make_shards([4, 3], subdir="set")
    (tmp_path / "set#v2").mkdir()
    source = f"{tmp_path}/set#v2/manifest.json"
    with pytest.raises(sk.ManifestError, match=re.escape("set#v2/manifest.json")) as exc:
        load_manifest(source)
    assert f"'{tmp_path}/set'" not in str(exc.value)
    with pytest.raises(sk.ManifestError, match=re.escape("set#v2/manifest.json")):
        sk.verify(source)


@pytest.mark.integration
def test_an_hf_folder_is_read_as_its_manifest_and_one_with_a_suffix_is_refused(
    make_shards: Callable[..., Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub folder ('hf://datasets/org/set/train/') is its manifest.json, as an s3:// or
    https:// one is (was: 'an hf:// url names a repository and a file'); with '?x=1' or
    '#x' after it, the folder is named (was, from ShardDataset: an error naming the index
    url of a shard it made of it, 'hf://.../train/.index/?x=1.idx')."""
    make_shards([4, 3], subdir="hub/datasets/org/set/resolve/main/train")
    with RangeServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url("").rstrip("/"))
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        folder = "hf://datasets/org/set/train/"
        assert len(load_manifest(folder)) == 2 and sk.verify(folder).ok
        assert len(list(sk.ShardDataset(folder))) == 7
        for suffix in ("?x=1", "#x"):
            with pytest.raises(sk.ConfigError, match="a folder is read as its manifest"):
                list(sk.ShardDataset(folder + suffix))
