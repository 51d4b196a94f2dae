"""The options of every remote read and of the node-local cache: one frozen
:class:`IoConfig` made of one frozen config per concern - the retry policy
(:class:`~shardkit.io.retry.RetryPolicy`), the cache (:class:`CacheConfig`) and the
reader's limits (:class:`ReaderLimits`) - beside the transport's own options.

An option is set and read one way, by its concern::

    IoConfig(retry=RetryPolicy(deadline=60), cache=CacheConfig(cache_dir="/nvme"))
    cfg.retry.deadline, cfg.cache.cache_dir, cfg.limits.verify

An option of a concern given to :class:`IoConfig` by its own name (the flat spelling
shardkit took before, ``IoConfig(cache_dir=...)``) is a :class:`ConfigError` naming the
spelling to use. The readers' entry points take ``io=`` and one shortcut for the cache,
``cache_dir=``/``cache_limit=`` (:func:`with_cache`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import ConfigError
from shardkit.format.tario.buffer import DEFAULT_MAX_MEMBER
from shardkit.format.tario.members import TAR_POLICIES
from shardkit.io.retry import RetryPolicy
from shardkit.units import parse_size
from shardkit.values import typed_fields

__all__ = [
    "DEFAULT_RANGE_SIZE",
    "CacheConfig",
    "IoConfig",
    "ReaderLimits",
    "misspelled",
    "with_cache",
]

# One ranged GET per 64 MiB. Measured against the test Range server on 127.0.0.1 with
# 20 ms added per request and a 100 MB/s cap, one 96 MiB object read through the uncached
# opener: 1 MiB ranges 31 MB/s, 4 MiB 63, 16 MiB 83, 64 MiB 91 (>= 90% of the cap), 256 MiB
# 88. Larger ranges buy nothing and a dropped connection resumes at its last byte anyway.
DEFAULT_RANGE_SIZE = 64 << 20


@dataclass(frozen=True)
class CacheConfig:
    """The node-local cache.

    Args:
        cache_dir: the node-local cache directory (None: no cache, remote reads stream); a
            ``pathlib.Path`` is taken as its text.
        cache_limit: bytes the cache may hold; None: no limit. Only with ``cache_dir``.
        prefetch_depth: how many of the next shards of a plan are fetched ahead.
        prefetch_threads: background download threads per process.
        node_requests: concurrent remote requests per node for cache fills (0: no cap).
        node_rate: remote requests per second per node that cache fills start from (0:
            ``node_requests`` per second, doubled every second until the store first
            throttles: a slow start; with ``rate_adapt=False``, 0 is no pacing).
        rate_adapt: the node's rate adapts to the store (:mod:`shardkit.io.rate`):
            halved on a 429 or 503 (SlowDown), raised additively while requests are
            served; False keeps it at ``node_rate`` (0: unpaced).
        request_rate: requests per second the whole job may make of its stores (0: no
            limit), for users who know their store's: each node's rate stays at or below
            its share, ``request_rate`` divided over the job's nodes (``WORLD_SIZE /
            LOCAL_WORLD_SIZE``, or the process group's).
        piece_parallel: ranged requests in flight per shard and process filling the cache.
        cache_wait: seconds a reader waits for a piece another process is fetching before
            :class:`CacheError` (its own requests are bounded by the retry policy).
        manifest_ttl: seconds a node's cached manifest is reused without asking the server.
        on_cache_error: ``"bypass"`` (log a :class:`CacheError`, read uncached) or ``"raise"``.
        cache_verify: ``"fill"`` (a shard is verified once, piece by piece as it is fetched)
            or ``"open"`` (a cached shard is hashed again at every open, piece by piece
            before each piece is read; one that rotted on disk is evicted and fetched again).
    """

    cache_dir: str | None = None
    cache_limit: int | None = None
    prefetch_depth: int = 2
    prefetch_threads: int = 2
    node_requests: int = 16
    node_rate: float = 0.0
    rate_adapt: bool = True
    request_rate: float = 0.0
    piece_parallel: int = 4
    cache_wait: float = 300.0
    manifest_ttl: float = 300.0
    on_cache_error: str = "bypass"
    cache_verify: str = "fill"

    def __post_init__(self) -> None:
        if isinstance(self.cache_dir, os.PathLike):  # a pathlib.Path: its text
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ConfigError(f"cache_dir must be a path, got {self.cache_dir!r}")
        if self.cache_dir == "":  # os.environ.get("CACHE", ""): not the working directory
            raise ConfigError("cache_dir is empty: give a folder, or None for no cache")
        typed_fields(self)
        if self.cache_limit is not None and self.cache_limit < 0:
            raise ConfigError(f"cache_limit must be >= 0 bytes, got {self.cache_limit!r}")
        if self.cache_limit is not None and self.cache_dir is None:  # it meant no cache
            raise ConfigError(
                f"CacheConfig: cache_limit={self.cache_limit!r} without cache_dir: give the "
                "cache's folder too (CacheConfig(cache_dir='/nvme/shardkit', cache_limit=...)), "
                "or no cache_limit for no cache"
            )
        if not self.cache_wait > 0:
            raise ConfigError(f"cache_wait must be > 0, got {self.cache_wait!r}")
        for name in (
            "prefetch_depth",
            "node_requests",
            "node_rate",
            "request_rate",
            "manifest_ttl",
        ):
            if not getattr(self, name) >= 0:  # NaN too
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if min(self.prefetch_threads, self.piece_parallel) < 1:
            raise ConfigError("prefetch_threads and piece_parallel must be >= 1")
        if self.cache_verify not in ("fill", "open"):
            raise ConfigError(f"cache_verify must be 'fill' or 'open', got {self.cache_verify!r}")
        if self.on_cache_error not in ("bypass", "raise"):
            raise ConfigError(
                f"on_cache_error must be 'bypass' or 'raise', got {self.on_cache_error!r}"
            )


@dataclass(frozen=True)
class ReaderLimits:
    """What a tar reader holds at most, and whether it checks what it reads.

    Args:
        max_member: the largest tar member (bytes) a reader holds in memory; a larger one
            is a :class:`ShardFormatError` before any of it is read.
        verify: ``"on"`` (every byte of a shard whose manifest has a checksum is verified
            before it is handed out, local or remote; see :mod:`shardkit.io.local`) or
            ``"off"`` (shards are read as they are; a cache still verifies what it fills).
        tar_policy: what the tar reader does with links, devices, FIFOs and unknown member
            types: ``"strict"`` (default) refuses the shard (:class:`ShardFormatError`
            naming it and the member's offset), ``"lenient"`` skips the member, counted
            (``skipped_members`` in a reader's counters) and warned naming the shard.
    """

    max_member: int = DEFAULT_MAX_MEMBER
    verify: str = "on"
    tar_policy: str = "strict"

    def __post_init__(self) -> None:
        typed_fields(self)
        if self.max_member < 1:
            raise ConfigError(f"max_member must be >= 1, got {self.max_member!r}")
        if self.verify not in ("on", "off"):
            raise ConfigError(f"verify must be 'on' or 'off', got {self.verify!r}")
        if self.tar_policy not in TAR_POLICIES:
            raise ConfigError(f"tar_policy must be one of {TAR_POLICIES}, got {self.tar_policy!r}")


_CONCERNS: dict[str, type[Any]] = {
    "retry": RetryPolicy,
    "cache": CacheConfig,
    "limits": ReaderLimits,
}
_CONCERN_OF: dict[str, str] = {  # an option of a concern -> the concern's field in IoConfig
    f.name: concern for concern, cls in _CONCERNS.items() for f in dataclasses.fields(cls)
}


def misspelled(owner: str, given: Iterable[str]) -> ConfigError:
    """The error for options ``owner`` does not take by these names: each io option named
    with the spelling to use (``IoConfig(cache=CacheConfig(cache_dir=...))``), the rest
    listed as unknown."""
    names = sorted(given)
    top = {f.name for f in dataclasses.fields(IoConfig)}
    moved = [n for n in names if n in _CONCERN_OF or n in top]
    parts = []
    if moved:
        by: dict[str, list[str]] = {}
        for n in moved:
            by.setdefault(_CONCERN_OF.get(n, ""), []).append(f"{n}=...")
        groups = ", ".join(
            ", ".join(ns) if not c else f"{c}={_CONCERNS[c].__name__}({', '.join(ns)})"
            for c, ns in by.items()
        )
        spelling = f"IoConfig({groups})"
        if owner != "IoConfig":
            spelling = f"{owner}(io={spelling})"
        imports = sorted({"IoConfig", *(_CONCERNS[c].__name__ for c in by if c)})
        parts.append(
            f"{owner} takes {', '.join(moved)} by concern: {spelling} "
            f"(from shardkit.io import {', '.join(imports)})"
        )
    unknown = [n for n in names if n not in moved]
    if unknown:
        parts.append(f"{owner} has no option {', '.join(unknown)} (IoConfig's: {sorted(top)})")
    return ConfigError("; ".join(parts))


@dataclass(frozen=True, init=False)
class IoConfig:
    """How shardkit reads remote bytes and caches them.

    Args:
        retry: the retry policy and the clock of every read (:class:`RetryPolicy`:
            ``max_attempts``, ``min_progress``, ``backoff_base``, ``backoff_max``,
            ``retry_after_max``, ``deadline``, ``min_rate``, ``rate_window``).
        cache: the node-local cache (:class:`CacheConfig`: ``cache_dir``, ``cache_limit``,
            ``prefetch_depth``, ``prefetch_threads``, ``node_requests``, ``node_rate``,
            ``rate_adapt``, ``request_rate``, ``piece_parallel``, ``cache_wait``,
            ``manifest_ttl``, ``on_cache_error``, ``cache_verify``).
        limits: what a reader holds at most and checks (:class:`ReaderLimits`:
            ``max_member``, ``verify``, ``tar_policy``).
        allow_pipe: allow ``pipe:CMD`` urls (only ever set in code, never by a manifest).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds without a byte before a read is abandoned and retried.
        range_size: bytes per ranged GET.
        endpoint_url: S3-compatible endpoint (default: ``AWS_ENDPOINT_URL`` or AWS).

    An option of ``retry``, ``cache`` or ``limits`` given here by its own name
    (``IoConfig(cache_dir=...)``) is a :class:`ConfigError` naming the spelling to use.
    """

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache: CacheConfig = field(default_factory=CacheConfig)
    limits: ReaderLimits = field(default_factory=ReaderLimits)
    allow_pipe: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    range_size: int = DEFAULT_RANGE_SIZE
    endpoint_url: str | None = None

    def __init__(
        self,
        *,
        retry: RetryPolicy | None = None,
        cache: CacheConfig | None = None,
        limits: ReaderLimits | None = None,
        allow_pipe: bool = False,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        range_size: int = DEFAULT_RANGE_SIZE,
        endpoint_url: str | None = None,
        **other: Any,
    ) -> None:
        if other:  # a flat option of a concern, or a typo: an error naming the way
            raise misspelled("IoConfig", other)
        given = {"retry": retry, "cache": cache, "limits": limits}
        for concern, cls in _CONCERNS.items():
            value = given[concern]
            if value is None:
                value = cls()
            elif not isinstance(value, cls):
                raise ConfigError(
                    f"IoConfig: {concern} must be a {cls.__name__}, not {type(value).__name__}"
                )
            object.__setattr__(self, concern, value)
        object.__setattr__(self, "allow_pipe", allow_pipe)
        object.__setattr__(self, "connect_timeout", connect_timeout)
        object.__setattr__(self, "read_timeout", read_timeout)
        object.__setattr__(self, "range_size", range_size)
        object.__setattr__(self, "endpoint_url", endpoint_url)
        typed_fields(self)  # allow_pipe="false" is no False
        for name in ("connect_timeout", "read_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.range_size < 1:
            raise ConfigError(f"range_size must be >= 1, got {self.range_size!r}")


def with_cache(
    io: IoConfig | None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
) -> IoConfig:
    """``io`` (default: ``IoConfig()``) with the readers' cache shortcut applied:
    ``cache_dir``/``cache_limit`` (``"500GB"``) set ``io.cache``'s, refused where ``io``
    names a cache of its own."""
    if io is not None and not isinstance(io, IoConfig):
        raise ConfigError(f"io must be an IoConfig, not {type(io).__name__}")
    base = io or IoConfig()
    if cache_dir is None and cache_limit is None:
        return base
    if io is not None and (io.cache.cache_dir, io.cache.cache_limit) != (None, None):
        raise ConfigError("give the cache in io= or in cache_dir=/cache_limit=, not both")
    if cache_dir is None:  # a limit alone read every shard uncached, with no word
        raise ConfigError(
            f"cache_limit={cache_limit!r} without cache_dir=: give the cache's folder too "
            "(cache_dir='/nvme/shardkit'), or no cache_limit for no cache"
        )
    limit = None if cache_limit is None else parse_size(cache_limit)
    path = os.fspath(cache_dir) if isinstance(cache_dir, os.PathLike) else cache_dir
    cache = dataclasses.replace(base.cache, cache_dir=path, cache_limit=limit)  # checks path
    return dataclasses.replace(base, cache=cache)
