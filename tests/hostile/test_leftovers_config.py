"""Hostile io options: a text option given as no text (``IoConfig(endpoint_url=123)``,
``ReaderLimits(verify=True)``) is a ConfigError naming the option where it is made, not a
TypeError (or a wrong endpoint) at the first read; a cache limit with no cache folder is a
ConfigError naming cache_dir (it meant no cache at all, with no word)."""

from __future__ import annotations

from typing import Any

import pytest

from shardkit.errors import ConfigError
from shardkit.io import CacheConfig, IoConfig, ReaderLimits
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
