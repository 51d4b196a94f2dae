"""Shared fixtures: shard factories, hypothesis profiles, a clean environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from shardkit.format.manifest.model import Manifest
from tests.helpers.data import make_shards as _make_shards

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="session")
def _user_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, _user_cache: Path) -> Iterator[None]:
    """Tests never see a distributed environment they did not set up themselves, and
    write no per-user cache (remote manifests' compact forms) into the real home."""
    for name in _DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(_user_cache))
    yield


@pytest.fixture
def make_shards(tmp_path: Path) -> Callable[..., Manifest]:
    """``make_shards([3, 5, 2])`` writes shards of those sample counts under tmp_path."""
    counter = iter(range(1_000_000))

    def make(sizes: list[int], subdir: str | None = None, **kwargs: Any) -> Manifest:
        out = tmp_path / (subdir or f"shards{next(counter)}")
        return _make_shards(out, sizes, **kwargs)

    return make
