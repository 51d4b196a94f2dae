"""Retry policy, backoff with jitter, and what a remote source raises to be tried again.

(Counters live in :mod:`shardkit.counters`.)

A remote source (HTTP, S3) only knows how to open one byte range and iterate its body; it
raises :class:`Retryable` for a failure worth another try (a dropped connection, a
timeout, 429/5xx). :class:`RetryPolicy` says how often and how long to wait (exponential
backoff with jitter, or the server's ``Retry-After``) and the clock a read runs under;
:mod:`shardkit.io.clocked` runs reads and calls under it
(:func:`~shardkit.io.clocked.resuming_chunks`, :func:`~shardkit.io.clocked.retried`). A
:data:`Gate` is the node's turn for one request.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from shardkit.errors import CacheError, ConfigError
from shardkit.values import typed_fields

__all__ = [
    "DEFAULT_MIN_PROGRESS",
    "DEFAULT_MIN_RATE",
    "DEFAULT_RATE_WINDOW",
    "Admission",
    "Gate",
    "NoTurn",
    "RangeResponse",
    "RetryPolicy",
    "Retryable",
    "parse_retry_after",
]


# The minimum rate of a remote body, as curl's --speed-limit 1024 --speed-time 30: a store
# under load is slow but keeps well above 1 KiB/s; a trickle below it for 30 s of waiting is
# a failure (retried from the last byte, and bounded by the deadline).
DEFAULT_MIN_RATE = 1024.0
DEFAULT_RATE_WINDOW = 30.0

# What a read must gain between drops to count as going forward: 64 KiB is far below what a
# link that serves shards brings between drops (MBs), about twice what the minimum rate asks
# of one window (30 KiB in 30 s), and far above a server that sends a byte and drops. A 2 GB
# shard is at most 32,768 such steps of at most max_attempts tries each: slow, never endless.
DEFAULT_MIN_PROGRESS = 64 << 10


def retry_kind(status: int | None) -> str:
    """How a retried failure is counted: ``throttled`` (429), ``server`` (other statuses)
    or ``connection`` (no answer, a broken or short body)."""
    if status is None:
        return "connection"
    return "throttled" if status == 429 else "server"


class Retryable(Exception):
    """A failure worth retrying; ``status`` and ``retry_after`` when the server said so;
    ``since`` (a :func:`time.monotonic` time) when the trouble began before it was seen."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        since: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.since = since


class RangeResponse(Protocol):
    """One open ranged read: the object's ``total`` size if known, and its body."""

    total: int | None

    def chunks(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """How remote reads retry, and the clock every read runs under (see the module).

    Args:
        max_attempts: tries in a row without progress before :class:`FetchError`.
        min_progress: bytes a read must gain for its tries to count as progress: once it
            has this many more than at its last progress, a dropped connection starts the
            count of tries and the backoff again (from ``backoff_base``), and the deadline
            runs from the drop. So a long object arrives whole over a link that keeps
            dropping, and a server that sends a few bytes and drops, again and again, is
            given up after ``max_attempts`` tries: a read makes at most ``max_attempts``
            tries per ``min_progress`` bytes of its range (one more per range).
        backoff_base: first backoff in seconds; it doubles per failure, with jitter.
        backoff_max: cap of one backoff.
        retry_after_max: cap on how long a server's ``Retry-After`` is honoured.
        deadline: seconds a read may spend in trouble (failing, stalled or below
            ``min_rate``) before :class:`FetchError`. Keep it below a DDP collective's
            timeout.
        min_rate: bytes per second a body must deliver over ``rate_window`` seconds of
            waiting on the server; 0: no minimum (only ``read_timeout`` and the deadline).
        rate_window: seconds over which ``min_rate`` is measured (at most the deadline).
    """

    max_attempts: int = 8
    min_progress: int = DEFAULT_MIN_PROGRESS
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    retry_after_max: float = 120.0
    deadline: float = 300.0
    min_rate: float = DEFAULT_MIN_RATE
    rate_window: float = DEFAULT_RATE_WINDOW

    def __post_init__(self) -> None:
        typed_fields(self)
        for name in ("backoff_base", "backoff_max", "deadline", "rate_window"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("retry_after_max", "min_rate"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("max_attempts", "min_progress"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    def window(self) -> float:
        """The seconds of waiting over which the minimum rate is measured."""
        return min(self.rate_window, self.deadline)

    def read_timeout(self, read_timeout: float) -> float:
        """The socket read timeout a source should use: no byte for a whole window is
        below any minimum rate, so a stall is never waited out past the window."""
        return min(read_timeout, self.window()) if self.min_rate > 0 else read_timeout

    def delay(self, failures: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before try ``failures + 1``."""
        if retry_after is not None:
            return min(retry_after, self.retry_after_max) + rng.uniform(0, self.backoff_base)
        step = min(self.backoff_max, self.backoff_base * 2.0 ** (failures - 1))
        return step / 2 + rng.uniform(0, step / 2)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


OpenRange = Callable[[int, int | None], RangeResponse]


class Admission(Protocol):
    """What a gate hands one request: told how the store answered it (a status, or None
    for no answer), so a node's rate can adapt (:mod:`shardkit.io.rate`)."""

    def answered(self, status: int | None, retry_after: float | None = None) -> None: ...


class NoTurn(CacheError):
    """A gate has no turn for a request before the deadline of its read."""


Gate = Callable[[float | None], AbstractContextManager["Admission | None"]]
"""The node's gate, held for the length of one request (its request cap and rate): called
with the :func:`time.monotonic` time by which the request must start (None: no deadline
runs), it waits for the request's turn."""
