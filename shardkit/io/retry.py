"""Retries with backoff and jitter, and resume from the last byte.

(Counters live in :mod:`shardkit.counters`.)

A remote source (HTTP, S3) only knows how to open one byte range and iterate its body; it
raises :class:`Retryable` for a failure worth another try (a dropped connection, a
timeout, 429/5xx). :func:`resuming_chunks` turns that into one contiguous stream of
``[start, end)``: after a failure it waits (exponential backoff with jitter, or the
server's ``Retry-After``) and asks again from the first byte it has not delivered. It gives
up with :class:`FetchError` (naming the url, the attempts and the time spent) after
``max_attempts`` failures, or once ``deadline`` seconds have passed since the first of them,
whichever comes first. Only a request that delivers all it was asked for ends a run of
failures: a server that sends part of every answer and then stalls still runs out of
attempts, and a ``Retry-After`` that would wait past the deadline is not waited for.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from shardkit.counters import Counters
from shardkit.errors import FetchError

__all__ = [
    "RangeResponse",
    "RetryPolicy",
    "Retryable",
    "parse_retry_after",
    "resuming_chunks",
]

log = logging.getLogger(__name__)


def retry_kind(status: int | None) -> str:
    """How a retried failure is counted: ``throttled`` (429), ``server`` (other statuses)
    or ``connection`` (no answer, a broken or short body)."""
    if status is None:
        return "connection"
    return "throttled" if status == 429 else "server"


class Retryable(Exception):
    """A failure worth retrying; ``status`` and ``retry_after`` when the server said so."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class RangeResponse(Protocol):
    """One open ranged read: the object's ``total`` size if known, and its body."""

    total: int | None

    def chunks(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with "equal jitter", and how long ``Retry-After`` is honoured."""

    max_attempts: int = 8
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    retry_after_max: float = 120.0
    deadline: float = 300.0

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


class _Clock:
    """When the current run of failures began (None: no failure since the last success)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def spent(self) -> float:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        return now - self.first


def resuming_chunks(
    url: str,
    open_range: OpenRange,
    start: int,
    end: int | None,
    *,
    policy: RetryPolicy,
    counters: Counters,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """Yield the bytes of ``[start, end)`` of ``url`` (``end`` None: to the object's end).

    ``open_range(pos, end)`` opens a read from ``pos``; it may deliver fewer bytes than
    asked (one range of a configured size), and the loop asks again from where it ended.
    """
    rng = random.Random()
    pos = start
    failures = 0
    clock = _Clock()
    while end is None or pos < end:
        try:
            resp = open_range(pos, end)
        except Retryable as exc:
            failures = _failed(url, exc, failures, policy, counters, rng, sleep, clock)
            continue
        try:
            if resp.total is not None and (end is None or end > resp.total):
                end = resp.total  # like a file: a read past the end stops at the end
            before = pos
            for chunk in resp.chunks():
                pos += len(chunk)
                yield chunk
            if pos == before:
                if end is None:
                    return  # an object of unknown size has ended
                if pos < end:
                    raise Retryable(f"the server sent no bytes at offset {pos} of {end}")
            failures = 0  # a whole answer: the run of failures is over
            clock.first = None
        except Retryable as exc:
            failures = _failed(url, exc, failures, policy, counters, rng, sleep, clock)
        finally:
            resp.close()


def _failed(
    url: str,
    exc: Retryable,
    failures: int,
    policy: RetryPolicy,
    counters: Counters,
    rng: random.Random,
    sleep: Callable[[float], None],
    clock: _Clock,
) -> int:
    """Count one failure: wait before the next try, or raise FetchError if out of tries
    or if the wait would end past the deadline."""
    failures += 1
    spent = clock.spent()
    wait = policy.delay(failures, exc.retry_after, rng)
    if failures >= policy.max_attempts or spent + wait > policy.deadline:
        why = "" if failures >= policy.max_attempts else f" (the deadline is {policy.deadline:g} s)"
        raise FetchError(
            f"giving up after {spent:.1f} s{why}: {exc}",
            url=url,
            status=exc.status,
            attempts=failures,
        ) from exc
    counters.add("retries")
    counters.add(f"retries_{retry_kind(exc.status)}")
    log.info("%s: %s; retry %d in %.2fs", url, exc, failures, wait)
    sleep(wait)
    return failures
