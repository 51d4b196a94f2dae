"""Hostile review of issue 33's one-spelling seams (IoConfig by concern, the readers' cache
shortcut, ShardWriter's keyword options): each value arrives at one place and is checked
there, so a value Python would accept but that means something else is a ConfigError
naming the option, never taken as another value."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.errors import ConfigError, ShardFormatError
from shardkit.io import CacheConfig, IoConfig, ReaderLimits


@pytest.mark.parametrize(
    "make",
    [
        lambda d: CacheConfig(cache_dir=""),
        lambda d: make_opener(cache_dir=""),
        lambda d: sk.ShardDataset(d, cache_dir=""),
    ],
    ids=["CacheConfig", "make_opener", "ShardDataset"],
)
def test_an_empty_cache_dir_is_refused_not_the_working_directory(
    make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache_dir=""`` (``os.environ.get("CACHE", "")``) made the working directory the
    node's cache: CACHEDIR.TAG, data/, ledger... written beside the user's files."""
    with sk.ShardWriter(tmp_path / "set", maxcount=2) as w:
        w.write({"__key__": "a", "txt": "x"})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError, match="cache_dir"):
        make(str(tmp_path / "set"))
    assert os.listdir(cwd) == []


@pytest.mark.parametrize("limit", [-1, -(2**40)])
def test_a_negative_cache_limit_is_refused(limit: int) -> None:
    """The grouped spelling took what the size parser refuses (``cache_limit="-1"`` and
    ``make_opener(cache_limit=-1)`` are ConfigErrors): every fill then found no room."""
    with pytest.raises(ConfigError, match="cache_limit"):
        CacheConfig(cache_dir="/nonexistent/c", cache_limit=limit)


@pytest.mark.parametrize("value", [5, 1.5, ["/tmp/c"]])
def test_a_cache_dir_that_is_no_path_is_a_config_error_at_every_entry(value: Any) -> None:
    """make_opener(cache_dir=5) and ShardDataset(cache_dir=5) raised a bare TypeError from
    os.fspath; CacheConfig(cache_dir=5) names the option."""
    with pytest.raises(ConfigError, match="cache_dir"):
        make_opener(cache_dir=value)
    with pytest.raises(ConfigError, match="cache_dir"):
        make_opener(IoConfig(), cache_dir=value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("maxcount", True), ("maxcount", 2.5), ("maxcount", "3"), ("image_quality", True)],
)
def test_writer_counts_take_no_bool_float_or_str(option: str, value: Any, tmp_path: Path) -> None:
    """ShardWriter(maxcount=True) cut a shard per sample, maxcount=2.5 every 3 samples,
    image_quality=True wrote JPEGs at quality 1, maxcount="3" a bare TypeError."""
    with pytest.raises(ConfigError, match=option):
        sk.ShardWriter(tmp_path / "out", **{option: value})
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_largest_member_message_names_the_spelling_a_reader_takes(tmp_path: Path) -> None:
    """'raise it with max_member=': ShardDataset(max_member=...) is a TypeError and
    IoConfig(max_member=...) a ConfigError since the one spelling; the way is limits=."""
    with sk.ShardWriter(tmp_path / "set") as w:
        w.write({"__key__": "a", "bin": b"x" * 3000})
    io = IoConfig(limits=ReaderLimits(max_member=1000))
    with pytest.raises(ShardFormatError, match=r"ReaderLimits\(max_member=") as err:
        list(sk.ShardDataset(tmp_path / "set", io=io))
    assert "1000 bytes" in str(err.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: make_opener(cache_limit="1GB"),
        lambda d: sk.ShardDataset(d, cache_limit="1GB"),
        lambda d: sk.IndexedShards(d, cache_limit=10**9),
    ],
    ids=["make_opener", "ShardDataset", "IndexedShards"],
)
def test_a_cache_limit_without_a_cache_dir_is_refused(make: Any, tmp_path: Path) -> None:
    """The shortcut's limit alone (cache_dir forgotten) read every remote shard uncached,
    with no word: the limit was dropped."""
    with sk.ShardWriter(tmp_path / "set") as w:
        w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(ConfigError, match="without cache_dir"):
        make(str(tmp_path / "set"))
