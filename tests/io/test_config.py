"""IoConfig has one spelling: each option is set and read by its concern (the retry policy,
the cache, the reader's limits) beside the transport's own options. An option given by its
old flat name (the constructor, ``dataclasses.replace``, ``make_opener``) is a ConfigError
naming the spelling to use; the readers' one shortcut is ``cache_dir=``/``cache_limit=``."""

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
from shardkit.io.config import CacheConfig, IoConfig, ReaderLimits
from shardkit.io.http import policy_of
from shardkit.io.retry import RetryPolicy

CONCERNS = {"retry": RetryPolicy, "cache": CacheConfig, "limits": ReaderLimits}
OLD_FLAT = {  # the options IoConfig once took by their own names, with their defaults
    "cache_dir": None,
    "cache_limit": None,
    "max_attempts": 8,
    "backoff_base": 0.25,
    "backoff_max": 30.0,
    "retry_after_max": 120.0,
    "deadline": 300.0,
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


def _concern(name: str) -> str:
    return next(
        c for c, cls in CONCERNS.items() if name in {f.name for f in dataclasses.fields(cls)}
    )


def test_every_option_is_read_by_its_concern_only() -> None:
    default = IoConfig()
    assert {k: getattr(getattr(default, _concern(k)), k) for k in OLD_FLAT} == OLD_FLAT
    assert not any(hasattr(default, k) for k in OLD_FLAT)  # no second spelling to read
    given = IoConfig(
        retry=RetryPolicy(deadline=8.0, min_rate=100.0),
        cache=CacheConfig(cache_dir=Path("/c"), cache_limit=5),
        limits=ReaderLimits(max_member=4096),
        range_size=8 << 20,
    )
    assert given.cache.cache_dir == "/c"  # a path-like is kept as its text
    assert (given.retry.deadline, given.limits.max_member, given.range_size) == (8.0, 4096, 8 << 20)
    assert policy_of(given) is given.retry


@pytest.mark.parametrize("name", sorted(OLD_FLAT))
def test_a_flat_option_is_a_config_error_naming_its_concern(name: str) -> None:
    concern = _concern(name)
    cls = CONCERNS[concern].__name__
    want = f"IoConfig\\({concern}={cls}\\({name}=\\.\\.\\.\\)\\)"
    with pytest.raises(ConfigError, match=want):
        IoConfig(**{name: OLD_FLAT[name]})
    with pytest.raises(ConfigError, match=want):
        dataclasses.replace(IoConfig(), **{name: OLD_FLAT[name]})  # type: ignore[misc]
    if name not in ("cache_dir", "cache_limit"):  # the readers' shortcut for the cache
        with pytest.raises(ConfigError, match=f"make_opener\\(io={want}\\)"):
            make_opener(**{name: OLD_FLAT[name]})


def test_errors_name_what_is_wrong_and_replace_by_concern_works() -> None:
    cfg = IoConfig(cache=CacheConfig(cache_dir="/a"), retry=RetryPolicy(deadline=5.0))
    moved = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, cache_limit=7))
    assert (moved.cache.cache_dir, moved.cache.cache_limit, moved.retry.deadline) == ("/a", 7, 5.0)
    assert pickle.loads(pickle.dumps(moved)) == moved
    with pytest.raises(ConfigError, match="no option rnage_size"):
        IoConfig(rnage_size=1)
    with pytest.raises(ConfigError, match="IoConfig\\(allow_pipe=\\.\\.\\.\\)"):
        make_opener(allow_pipe=True)
    with pytest.raises(ConfigError, match="cache must be a CacheConfig"):
        IoConfig(cache={"cache_dir": "/a"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cache_dir must be a path"):
        CacheConfig(cache_dir=3)  # type: ignore[arg-type]
    for cls, bad, word in [
        (IoConfig, {"read_timeout": 0}, "read_timeout"),
        (IoConfig, {"range_size": 0}, "range_size"),
        (RetryPolicy, {"deadline": 0}, "deadline"),
        (RetryPolicy, {"max_attempts": 0}, "max_attempts"),
        (RetryPolicy, {"min_rate": -1}, "min_rate"),
        (CacheConfig, {"cache_wait": -1}, "cache_wait"),
        (CacheConfig, {"on_cache_error": "ignore"}, "on_cache_error"),
        (CacheConfig, {"cache_verify": "always"}, "cache_verify"),
        (ReaderLimits, {"max_member": 0}, "max_member"),
    ]:
        with pytest.raises(ConfigError, match=word):
            cls(**bad)


def test_options_by_concern_reach_the_reader(make_shards: object, tmp_path: Path) -> None:
    m: Manifest = make_shards([3, 4])  # type: ignore[operator]
    io = IoConfig(
        cache=CacheConfig(cache_dir=str(tmp_path / "c")), limits=ReaderLimits(max_member=1 << 20)
    )
    assert len(list(ShardDataset(m, io=io))) == 7
    given = IoConfig(retry=RetryPolicy(deadline=9.0), limits=ReaderLimits(max_member=1 << 20))
    opener = make_opener(given, cache_dir=tmp_path / "c", cache_limit="1GB")
    cfg = opener.cfg  # type: ignore[attr-defined]
    assert (cfg.retry.deadline, cfg.limits.max_member) == (9.0, 1 << 20)
    assert (cfg.cache.cache_dir, cfg.cache.cache_limit) == (str(tmp_path / "c"), 10**9)
    with pytest.raises(ConfigError, match="not both"):
        make_opener(io, cache_dir=tmp_path / "d")
