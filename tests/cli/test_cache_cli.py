"""``shardkit cache``: the cache dir as an argument (``cache stat DIR``) or as --cache-dir."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shardkit.cli import cli
from shardkit.format.manifest.model import Manifest
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["cache", *args], env=env)


def test_stat_clean_and_verify_take_the_dir_as_an_argument(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([3, 4], subdir="set")
    cache = str(tmp_path / "cache")
    with RangeServer(str(m.base)) as srv:
        warm = run("warm", srv.url("manifest.json"), "--cache-dir", cache, "--json")
        assert warm.exit_code == 0, warm.output
    by_arg = run("stat", cache, "--json")
    assert by_arg.exit_code == 0, by_arg.output
    assert json.loads(by_arg.output)["shards"] == 2
    by_option = run("stat", "--cache-dir", cache, "--json")
    assert json.loads(by_option.output)["shards"] == 2
    other = str(tmp_path / "elsewhere")
    by_env = run("stat", cache, "--json", env={"SHARDKIT_CACHE_DIR": other})
    assert json.loads(by_env.output)["shards"] == 2  # DIR wins over the environment
    assert run("verify", cache).exit_code == 0
    cleaned = run("clean", cache, "--all")
    assert cleaned.exit_code == 0 and "evicted 2 shards" in cleaned.output
    assert json.loads(run("stat", cache, "--json").output)["shards"] == 0


def test_no_dir_or_two_dirs_is_a_usage_error(tmp_path: Path) -> None:
    none = run("stat", env={"SHARDKIT_CACHE_DIR": ""})
    assert none.exit_code == 2 and "give the cache dir" in none.output
    two = run("stat", str(tmp_path / "a"), "--cache-dir", str(tmp_path / "b"))
    assert two.exit_code == 2 and "two cache dirs" in two.output
