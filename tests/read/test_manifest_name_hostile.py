"""A manifest is told from a shard by its name: the name a local path really has (a '?'
is part of it) and the path of a url (its query and fragment are not)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import shardkit as sk
from shardkit import Manifest
from tests.helpers.servers import RangeServer


def test_a_local_folder_whose_name_holds_a_question_mark(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    """'sets?v=2/manifest.json' is a manifest: ShardDataset and IndexedShards read its 7
    samples, as load_manifest and verify do; they cut the name at '?' ('sets') and read
    the manifest as a shard ('not a tar header')."""
    make_shards([4, 3], subdir="sets?v=2")
    folder = tmp_path / "sets?v=2"
    for source in (str(folder / "manifest.json"), str(folder), f"{folder}/"):
        assert len(list(sk.ShardDataset(source))) == 7
        assert len(sk.IndexedShards(source)) == 7
        assert sk.verify(source).ok


@pytest.mark.integration
def test_a_remote_manifest_url_with_a_fragment_is_refused_as_a_manifest(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    """'.../manifest.json#part' is refused as the manifest url it is ('#' would cut it), as
    load_manifest refuses it; the data set took it for a shard and named an index url
    made from it ('.index/manifest.json#part.idx')."""
    make_shards([4, 3], subdir="set")
    with RangeServer(tmp_path / "set") as server:
        url = server.url("manifest.json") + "#part"
        reads: list[Callable[[str], object]] = [
            lambda u: list(sk.ShardDataset(u)),
            lambda u: len(sk.IndexedShards(u)),
        ]
        for read in reads:
            with pytest.raises(sk.ConfigError, match="'#' would cut the url") as exc:
                read(url)
            assert ".index" not in str(exc.value) and url in str(exc.value)
