"""Hostile: ``shardkit cache stat|clean|verify DIR`` on a DIR that is not a cache.

A folder of the user's data given as the cache (a typo, ``$HOME``, a data folder) was taken
for one: ``stat`` wrote a CACHEDIR.TAG and the cache's folders into it, and ``clean --all``
deleted every file three levels under its ``data/`` (``data/photos/2024/img.jpg``). A
missing DIR was reported as an empty cache (``clean`` created it).
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from shardkit.cache import CacheStore
from shardkit.cli import cli
from shardkit.errors import CacheError


def _user_folder(root: str) -> list[str]:
    files = [
        os.path.join(root, "data", "photos", "2024", "img1.jpg"),
        os.path.join(root, "data", "photos", "2024", "img2.jpg"),
        os.path.join(root, "notes.txt"),
    ]
    for f in files:
        os.makedirs(os.path.dirname(f), exist_ok=True)
        with open(f, "w") as fh:
            fh.write("precious")
    return files


def _tree(root: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, subs, names in os.walk(root) for n in subs + names)


@pytest.mark.parametrize(
    "how",
    [["clean", "{d}", "--all"], ["clean", "--cache-dir", "{d}", "--keep", "0"], ["stat", "{d}"]],
)
def test_a_folder_of_user_data_is_refused_untouched(tmp_path, how):
    home = str(tmp_path / "home")
    _user_folder(home)
    before = _tree(home)
    args = ["cache", *(a.format(d=home) for a in how)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    assert "not a shardkit cache" in str(res.exception) and home in str(res.exception)
    assert _tree(home) == before  # nothing deleted, nothing written


def test_the_environment_names_a_user_folder(tmp_path, monkeypatch):
    home = str(tmp_path / "home")
    _user_folder(home)
    before = _tree(home)
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", home)
    res = CliRunner().invoke(cli, ["cache", "clean", "--all"])
    assert res.exit_code == 1 and _tree(home) == before


def test_a_store_is_never_made_in_a_user_folder(tmp_path):
    home = str(tmp_path / "home")
    _user_folder(home)
    with pytest.raises(CacheError, match="not a shardkit cache"):
        CacheStore(home).ensure()
    assert not os.path.exists(os.path.join(home, "CACHEDIR.TAG"))


def test_a_folder_holding_only_data_is_not_a_cache(tmp_path):
    root = str(tmp_path / "proj")
    os.makedirs(os.path.join(root, "data", "a", "b"))
    with open(os.path.join(root, "data", "a", "b", "results.csv"), "w") as f:
        f.write("1,2")
    res = CliRunner().invoke(cli, ["cache", "clean", root, "--all"])
    assert res.exit_code == 1
    assert os.path.exists(os.path.join(root, "data", "a", "b", "results.csv"))


@pytest.mark.parametrize("cmd", ["stat", "verify", "clean"])
def test_a_missing_dir_is_named_not_made(tmp_path, cmd):
    where = str(tmp_path / "typo")
    args = ["cache", cmd, where, *(["--all"] if cmd == "clean" else [])]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "does not exist" in str(res.exception)
    assert not os.path.exists(where)


def test_a_real_cache_still_cleans(tmp_path):
    root = str(tmp_path / "cache")
    CacheStore(root).ensure()
    os.makedirs(os.path.join(root, "data", "sha256", "ab"))
    with open(os.path.join(root, "data", "sha256", "ab", "ab" * 32), "w") as f:
        f.write("x" * 10)
    res = CliRunner().invoke(cli, ["cache", "clean", root, "--all"])
    assert res.exit_code == 0, res.output
    assert "evicted 1 shard" in res.output


@pytest.fixture
def local_set(tmp_path):
    import shardkit as sk

    with sk.ShardWriter(tmp_path / "set", maxcount=2) as w:
        for i in range(4):
            w.write({"__key__": f"{i:04d}", "txt": f"s{i}"})
    return str(tmp_path / "set" / "manifest.json")


def test_warming_a_local_set_is_named_not_an_assertion(tmp_path, local_set):
    """cache warm on a local manifest died of an AssertionError in the fill threads."""
    res = CliRunner().invoke(cli, ["cache", "warm", local_set, "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 1 and isinstance(res.exception, CacheError), res.output
    assert "local disk" in str(res.exception)


@pytest.mark.parametrize("shards", ["a:b", "-1:", "1:x", "2"])
def test_a_bad_shard_range_is_a_usage_error(tmp_path, local_set, shards):
    """'a:b' was a ValueError traceback; '-1:' warmed every shard."""
    args = ["cache", "warm", local_set, "--cache-dir", str(tmp_path / "c"), "--shards", shards]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "--shards" in res.output


@pytest.mark.parametrize("keep", ["1.5", "0.5"])
def test_clean_keep_a_fraction_of_a_byte_is_refused_not_everything_evicted(tmp_path, keep):
    """--keep 1.5 (meant 1.5GB) kept 1 byte: the whole cache was evicted."""
    root = str(tmp_path / "cache")
    CacheStore(root).ensure()
    os.makedirs(os.path.join(root, "data", "sha256", "ab"))
    shard = os.path.join(root, "data", "sha256", "ab", "ab" * 32)
    with open(shard, "w") as f:
        f.write("x" * 10)
    res = CliRunner().invoke(cli, ["cache", "clean", root, "--keep", keep])
    assert res.exit_code == 1 and "whole" in str(res.exception)
    assert os.path.exists(shard)
