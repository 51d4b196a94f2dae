"""Shared fixtures: shard factories, hypothesis profiles, a clean environment."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from shardkit.format.manifest.model import Manifest
from tests.helpers.data import make_shards as _make_shards
from tests.helpers.data import unsynced

# 25 examples a property test (the team's bound): 60 made the property tests a tenth of CI
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
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


@pytest.fixture(scope="session", autouse=True)
def _no_fsync() -> Iterator[None]:
    """fsync a no-op in the test process (see :func:`tests.helpers.data.unsynced`);
    ``SHARDKIT_TEST_FSYNC=1`` keeps the real one."""
    if os.environ.get("SHARDKIT_TEST_FSYNC") == "1":
        yield
        return
    with unsynced():
        yield


@pytest.fixture
def make_shards(tmp_path: Path) -> Callable[..., Manifest]:
    """``make_shards([3, 5, 2])`` writes shards of those sample counts under tmp_path."""
    counter = iter(range(1_000_000))

    def make(sizes: list[int], subdir: str | None = None, **kwargs: Any) -> Manifest:
        out = tmp_path / (subdir or f"shards{next(counter)}")
        return _make_shards(out, sizes, **kwargs)

    return make


# seconds past a test's pytest-timeout before the watchdog ends the run
_GRACE = float(os.environ.get("SHARDKIT_TEST_GRACE", "90"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A bound on every test, its setup and teardown included, that holds where
    pytest-timeout's signal cannot: a main thread blocked in C, or a teardown that hangs after
    the timeout failed the test (pytest-timeout arms once). Past the test's timeout plus
    ``_GRACE`` the watchdog writes every thread's stack to the real stderr and ends the run,
    so CI fails at once, naming the test, instead of waiting out its own limit."""
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    done = threading.Event()

    def watch() -> None:
        if done.wait(float(limit or 300) + _GRACE):
            return
        fd = os.dup(2) if _REAL_STDERR is None else _REAL_STDERR
        os.write(fd, f"\n\nwatchdog: {item.nodeid} ran past {limit} s + {_GRACE} s\n".encode())
        faulthandler.dump_traceback(file=fd, all_threads=True)
        os._exit(3)

    threading.Thread(target=watch, name="test-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


_REAL_STDERR: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Keep a descriptor of the terminal's stderr for the watchdog (fd 2 is captured)."""
    global _REAL_STDERR
    _REAL_STDERR = os.dup(sys.__stderr__.fileno()) if sys.__stderr__ is not None else None
