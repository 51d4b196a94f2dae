"""The options of every remote read and of the node-local cache, in one frozen dataclass."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ConfigError
from shardkit.format.tario.reader import DEFAULT_MAX_MEMBER
from shardkit.units import parse_size

__all__ = ["DEFAULT_MIN_RATE", "DEFAULT_RANGE_SIZE", "DEFAULT_RATE_WINDOW", "IoConfig"]

# One ranged GET per 64 MiB. Measured against the test Range server on 127.0.0.1 with
# 20 ms added per request and a 100 MB/s cap, one 96 MiB object read through the uncached
# opener: 1 MiB ranges 31 MB/s, 4 MiB 63, 16 MiB 83, 64 MiB 91 (>= 90% of the cap), 256 MiB
# 88. Larger ranges buy nothing and a dropped connection resumes at its last byte anyway.
DEFAULT_RANGE_SIZE = 64 << 20

# The minimum rate of a remote body, as curl's --speed-limit 1024 --speed-time 30: a store
# under load is slow but keeps well above 1 KiB/s; a trickle below it for 30 s of waiting is
# a failure (retried from the last byte, and bounded by the deadline).
DEFAULT_MIN_RATE = 1024.0
DEFAULT_RATE_WINDOW = 30.0


@dataclass(frozen=True)
class IoConfig:
    """How shardkit reads remote bytes and caches them.

    Args:
        cache_dir: the node-local cache directory (None: no cache, remote reads stream).
        cache_limit: bytes the cache may hold ("500GB"); None: no limit.
        allow_pipe: allow ``pipe:CMD`` urls (only ever set in code, never by a manifest).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds without a byte before a read is abandoned and retried.
        range_size: bytes per ranged GET.
        max_attempts: tries of one request without progress before :class:`FetchError`.
        backoff_base: first backoff in seconds; it doubles per failure, with jitter.
        backoff_max: cap of one backoff.
        retry_after_max: cap on how long a server's ``Retry-After`` is honoured.
        deadline: seconds a remote read may spend in trouble - failing, stalled or below
            ``min_rate`` - before :class:`FetchError` (from when the trouble began until a
            request delivers all it asked for); a wait that would end past it is not
            begun, a ``Retry-After`` past it fails at once. Keep it below a DDP
            collective's timeout.
        min_rate: bytes per second a remote body must deliver over ``rate_window``
            seconds of waiting on the server, else the request is given up and asked
            again from its last byte (curl's ``--speed-limit``); 0: no minimum.
        rate_window: seconds of ``min_rate`` (curl's ``--speed-time``); never longer than
            ``deadline``.
        endpoint_url: S3-compatible endpoint (default: ``AWS_ENDPOINT_URL`` or AWS).
        prefetch_depth: how many of the next shards of a plan are fetched ahead.
        prefetch_threads: background download threads per process.
        node_requests: concurrent remote requests per node for cache fills (0: no cap).
        piece_parallel: ranged requests in flight per shard and process filling the cache.
        cache_wait: seconds a reader waits for a piece another process is fetching before
            :class:`CacheError` (its own requests are bounded by the retry policy).
        manifest_ttl: seconds a node's cached manifest is reused without asking the server.
        on_cache_error: ``"bypass"`` (log a :class:`CacheError`, read uncached) or ``"raise"``.
        cache_verify: ``"fill"`` (a shard is verified once, piece by piece as it is fetched)
            or ``"open"`` (a cached shard is hashed again at every open, piece by piece
            before each piece is read; one that rotted on disk is evicted and fetched again).
        max_member: the largest tar member (bytes, or "2GiB") a reader holds in memory;
            a larger one is a :class:`ShardFormatError` before any of it is read.
    """

    cache_dir: str | None = None
    cache_limit: int | None = None
    allow_pipe: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    range_size: int = DEFAULT_RANGE_SIZE
    max_attempts: int = 8
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    retry_after_max: float = 120.0
    deadline: float = 300.0
    min_rate: float = DEFAULT_MIN_RATE
    rate_window: float = DEFAULT_RATE_WINDOW
    endpoint_url: str | None = None
    prefetch_depth: int = 2
    prefetch_threads: int = 2
    node_requests: int = 16
    piece_parallel: int = 4
    cache_wait: float = 300.0
    manifest_ttl: float = 300.0
    on_cache_error: str = "bypass"
    cache_verify: str = "fill"
    max_member: int = DEFAULT_MAX_MEMBER

    def __post_init__(self) -> None:
        for name in (
            "connect_timeout",
            "read_timeout",
            "backoff_base",
            "backoff_max",
            "cache_wait",
            "deadline",
            "rate_window",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "prefetch_depth",
            "node_requests",
            "retry_after_max",
            "manifest_ttl",
            "min_rate",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        least = (self.max_attempts, self.prefetch_threads, self.range_size, self.max_member)
        if min(*least, self.piece_parallel) < 1:
            raise ConfigError(
                "max_attempts, prefetch_threads, range_size, max_member and piece_parallel "
                "must be >= 1"
            )
        if self.cache_verify not in ("fill", "open"):
            raise ConfigError(f"cache_verify must be 'fill' or 'open', got {self.cache_verify!r}")
        if self.on_cache_error not in ("bypass", "raise"):
            raise ConfigError(
                f"on_cache_error must be 'bypass' or 'raise', got {self.on_cache_error!r}"
            )

    @classmethod
    def make(
        cls,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        allow_pipe: bool = False,
        **options: Any,
    ) -> IoConfig:
        """Build a config from keyword options, parsing sizes ("64MiB") and paths."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown io options {unknown}; known: {sorted(known)}")
        for name in ("range_size", "max_member"):
            if name in options and isinstance(options[name], str):
                options[name] = parse_size(options[name])
        return cls(
            cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            cache_limit=parse_size(cache_limit) if cache_limit is not None else None,
            allow_pipe=allow_pipe,
            **options,
        )
