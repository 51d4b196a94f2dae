"""IoConfig by concern (retry policy, cache, reader limits), the old flat keywords still
accepted everywhere they were: the constructor, ``make``, ``dataclasses.replace``, reads."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from shardkit import ShardDataset
from shardkit.cache import make_opener
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.buffer import DEFAULT_MAX_MEMBER
from shardkit.io.config import FLAT, CacheConfig, IoConfig, ReaderLimits, RetryPolicy
from shardkit.io.http import policy_of

OLD_FIELDS = {  # the 21 flat fields of IoConfig before the split, with their defaults
    "cache_dir": None,
    "cache_limit": None,
    "allow_pipe": False,
    "connect_timeout": 10.0,
    "read_timeout": 60.0,
    "range_size": 64 << 20,
    "max_attempts": 8,
    "backoff_base": 0.25,
    "backoff_max": 30.0,
    "retry_after_max": 120.0,
    "deadline": 300.0,
    "endpoint_url": None,
    "prefetch_depth": 2,
    "prefetch_threads": 2,
    "node_requests": 16,
    "piece_parallel": 4,
    "cache_wait": 300.0,
    "manifest_ttl": 300.0,
    "on_cache_error": "bypass",
    "cache_verify": "fill",
    "max_member": DEFAULT_MAX_MEMBER,
}
CHANGED = {  # another value for each
    "cache_dir": "/nvme/cache",
    "cache_limit": 10**9,
    "allow_pipe": True,
    "connect_timeout": 3.0,
    "read_timeout": 7.0,
    "range_size": 8 << 20,
    "max_attempts": 3,
    "backoff_base": 0.5,
    "backoff_max": 4.0,
    "retry_after_max": 9.0,
    "deadline": 60.0,
    "endpoint_url": "http://127.0.0.1:9000",
    "prefetch_depth": 5,
    "prefetch_threads": 3,
    "node_requests": 0,
    "piece_parallel": 2,
    "cache_wait": 30.0,
    "manifest_ttl": 0.0,
    "on_cache_error": "raise",
    "cache_verify": "open",
    "max_member": 1 << 20,
}


def _read(cfg: IoConfig, name: str) -> object:
    """An option read where it lives: by its concern, or on the config (a transport's)."""
    return getattr(getattr(cfg, FLAT[name]) if name in FLAT else cfg, name)


def test_every_flat_option_is_set_by_its_name_and_read_by_its_concern() -> None:
    default = IoConfig()
    assert {k: _read(default, k) for k in OLD_FIELDS} == OLD_FIELDS
    given = IoConfig(**CHANGED)
    assert {k: _read(given, k) for k in CHANGED} == CHANGED
    assert not any(hasattr(given, k) for k in FLAT)  # no second spelling to read it by
    assert given == IoConfig.make(**CHANGED)
    # each by its concern
    assert given.retry == RetryPolicy(
        max_attempts=3, backoff_base=0.5, backoff_max=4.0, retry_after_max=9.0, deadline=60.0
    )
    assert given.cache == CacheConfig(
        **{k: v for k, v in CHANGED.items() if FLAT.get(k) == "cache"}  # type: ignore[arg-type]
    )
    assert given.limits == ReaderLimits(max_member=1 << 20)
    assert policy_of(given) is given.retry


def test_nested_and_flat_say_the_same_and_flat_overrides_its_concern() -> None:
    nested = IoConfig(
        retry=RetryPolicy(deadline=8.0, min_rate=100.0),
        cache=CacheConfig(cache_dir="/c", cache_limit=5),
        limits=ReaderLimits(max_member=4096),
    )
    flat = IoConfig(deadline=8.0, min_rate=100.0, cache_dir="/c", cache_limit=5, max_member=4096)
    assert nested == flat and hash(nested) == hash(flat)
    over = IoConfig(retry=RetryPolicy(deadline=8.0, max_attempts=2), deadline=9.0)
    assert (over.retry.deadline, over.retry.max_attempts) == (9.0, 2)
    assert IoConfig.make(cache_dir=Path("/c"), cache_limit="1GB", range_size="8MiB").cache == (
        CacheConfig(cache_dir="/c", cache_limit=10**9)
    )


def test_replace_pickle_and_errors_as_before() -> None:
    cfg = IoConfig(cache_dir="/a", deadline=5.0)
    moved = dataclasses.replace(cfg, cache_dir="/b", cache_limit=7)  # type: ignore[call-arg]
    assert (moved.cache.cache_dir, moved.cache.cache_limit, moved.retry.deadline) == (
        "/b",
        7,
        5.0,
    )
    assert pickle.loads(pickle.dumps(moved)) == moved
    with pytest.raises(ConfigError, match="unknown io options"):
        IoConfig.make(rnage_size=1)
    with pytest.raises(TypeError, match="rnage_size"):
        IoConfig(rnage_size=1)
    for bad, word in [
        ({"read_timeout": 0}, "read_timeout"),
        ({"deadline": 0}, "deadline"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"cache_wait": -1}, "cache_wait"),
        ({"on_cache_error": "ignore"}, "on_cache_error"),
        ({"cache_verify": "always"}, "cache_verify"),
        ({"max_member": 0}, "max_member"),
        ({"range_size": 0}, "range_size"),
        ({"min_rate": -1}, "min_rate"),
    ]:
        with pytest.raises(ConfigError, match=word):
            IoConfig(**bad)


def test_flat_options_reach_the_reader(make_shards: object, tmp_path: Path) -> None:
    m: Manifest = make_shards([3, 4])  # type: ignore[operator]
    ds = ShardDataset(m, io=IoConfig(cache_dir=str(tmp_path / "c"), max_member=1 << 20))
    assert len(list(ds)) == 7
    opener = make_opener(cache_dir=tmp_path / "c", deadline=9.0, max_member="1MiB")
    assert opener.cfg.retry.deadline == 9.0 and opener.cfg.limits.max_member == 1 << 20  # type: ignore[attr-defined]
