"""Hostile io options: a text option given as no text (``IoConfig(endpoint_url=123)``,
``ReaderLimits(verify=True)``) is a ConfigError naming the option where it is made, not a
TypeError (or a wrong endpoint) at the first read; a cache limit with no cache folder is a
ConfigError naming cache_dir (it meant no cache at all, with no word)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.errors import ConfigError
from shardkit.io import CacheConfig, IoConfig, ReaderLimits
from shardkit.io.config import with_cache
from shardkit.values import typed_fields

TEXT: list[tuple[Any, str, Any]] = [
    (IoConfig, "endpoint_url", 123),
    (IoConfig, "endpoint_url", b"http://127.0.0.1:9000"),
    (IoConfig, "endpoint_url", ["http://a"]),
    (CacheConfig, "on_cache_error", 1),
    (CacheConfig, "cache_verify", None),
    (ReaderLimits, "verify", True),
    (ReaderLimits, "tar_policy", None),
]


@pytest.mark.parametrize(("cls", "name", "value"), TEXT)
def test_a_text_option_that_is_no_text_is_refused(cls: Any, name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{cls.__name__}: {name} must be"):
        cls(**{name: value})


def test_text_options_are_still_taken() -> None:
    assert IoConfig(endpoint_url="http://127.0.0.1:9000").endpoint_url == "http://127.0.0.1:9000"
    assert IoConfig(endpoint_url=None).endpoint_url is None
    assert ReaderLimits(verify="off", tar_policy="lenient").verify == "off"


def test_typed_fields_checks_text_and_optional_text() -> None:
    from dataclasses import dataclass

    @dataclass
    class Options:
        name: str = "a"
        where: str | None = None

    typed_fields(Options(where="b"))
    with pytest.raises(ConfigError, match="Options: name must be text"):
        typed_fields(Options(name=3))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Options: where must be text or None"):
        typed_fields(Options(where=1.5))  # type: ignore[arg-type]


def test_a_cache_limit_without_a_cache_dir_is_refused(tmp_path: Path) -> None:
    """``CacheConfig(cache_limit=X)`` alone read every shard uncached with no word, as the
    readers' shortcut ``cache_limit=`` alone did before it was refused."""
    with pytest.raises(ConfigError, match="without cache_dir"):
        CacheConfig(cache_limit=10**9)
    with pytest.raises(ConfigError, match="without cache_dir"):
        IoConfig(cache=CacheConfig(cache_limit=0))
    with pytest.raises(ConfigError, match="without cache_dir"):
        sk.ShardDataset(str(tmp_path / "m.json"), cache_limit="1GB")
    cache = CacheConfig(cache_dir=str(tmp_path / "c"), cache_limit=10**9)
    assert (cache.cache_dir, cache.cache_limit) == (str(tmp_path / "c"), 10**9)
    shortcut = with_cache(None, cache_dir=tmp_path / "c", cache_limit="1GB")
    assert shortcut.cache.cache_limit == 10**9
