"""Retries with backoff and jitter, resume from the last byte, and a clock on every read.

(Counters live in :mod:`shardkit.counters`.)

A remote source (HTTP, S3) only knows how to open one byte range and iterate its body; it
raises :class:`Retryable` for a failure worth another try (a dropped connection, a
timeout, 429/5xx). :func:`resuming_chunks` turns that into one contiguous stream of
``[start, end)``: after a failure it waits (exponential backoff with jitter, or the
server's ``Retry-After``) and asks again from the first byte it has not delivered.

**The clock.** A read is in trouble from the moment it stops getting its bytes at the
minimum rate: a request that fails (from when it was sent), a body that breaks or stalls
(from the last byte it gave), or a body that trickles - fewer than ``min_rate`` bytes per
second over ``rate_window`` seconds of waiting on the server (as curl's ``--speed-limit``/
``--speed-time``; the window is never longer than the deadline, or than what is left of
it). A slow trickle is a failure like a drop: the request is given up and asked again from
its last byte. The read gives up with :class:`FetchError` (naming the url, the attempts
and the time spent) after ``max_attempts`` failures, or once ``deadline`` seconds have
passed since its trouble began, whichever comes first; a wait that would end past the
deadline is not begun, and a ``Retry-After`` past what is left of it fails at once, naming
it. Only a request that delivers all it was asked for ends the trouble. Time the consumer
spends between chunks is its own, never the server's: a reader paused by a slow training
step is not a slow server. So ``deadline`` bounds the wall time a read spends without
progress at the minimum rate; a server that keeps the rate is progress, however long the
object (defaults: 1 KiB/s over 30 s, as ``curl -Y 1024 -y 30``).
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from shardkit.activity import waiting
from shardkit.counters import Counters
from shardkit.errors import CacheError, ConfigError, FetchError
from shardkit.values import typed_fields

__all__ = [
    "DEFAULT_MIN_RATE",
    "DEFAULT_RATE_WINDOW",
    "Admission",
    "Gate",
    "NoTurn",
    "RangeResponse",
    "RetryPolicy",
    "Retryable",
    "parse_retry_after",
    "resuming_chunks",
    "retried",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# The minimum rate of a remote body, as curl's --speed-limit 1024 --speed-time 30: a store
# under load is slow but keeps well above 1 KiB/s; a trickle below it for 30 s of waiting is
# a failure (retried from the last byte, and bounded by the deadline).
DEFAULT_MIN_RATE = 1024.0
DEFAULT_RATE_WINDOW = 30.0


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
        max_attempts: tries of one request without progress before :class:`FetchError`.
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
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts!r}")

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


class _Clock:
    """When the read's current trouble began (None: none since the last whole answer)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def spent(self, since: float | None = None) -> float:
        """Seconds in trouble, counting from ``since`` where it began before now."""
        now = time.monotonic()
        began = now if since is None else min(since, now)
        if self.first is None or began < self.first:
            self.first = began
        return now - self.first

    def left(self, policy: RetryPolicy) -> float:
        """Seconds left before the deadline (all of it when not in trouble)."""
        if self.first is None:
            return policy.deadline
        return policy.deadline - (time.monotonic() - self.first)

    def until(self, policy: RetryPolicy) -> float | None:
        """When the deadline falls (None: not in trouble, no deadline runs)."""
        return None if self.first is None else self.first + policy.deadline


class _Pace:
    """The minimum rate of one body, over a window sliding on the time spent waiting for
    bytes (the consumer's time between chunks is not counted): marks every eighth of a
    window (waited seconds, bytes) and measures from the newest mark a window old."""

    def __init__(self, min_rate: float, window: float, opened: float) -> None:
        self.min_rate = min_rate
        self.window = window
        self.waited = 0.0
        self.got = 0
        self.marks: collections.deque[tuple[float, int]] = collections.deque([(0.0, 0)])
        self.wait_began = opened  # where trouble began if the body breaks now

    def chunks(self, body: Iterator[bytes], wait: waiting) -> Iterator[bytes]:
        """``body``'s chunks; :class:`Retryable` when a window falls below the rate."""
        while True:
            began = time.monotonic()
            with wait:
                chunk = next(body, None)
            now = time.monotonic()
            self.waited += now - began
            if chunk is None:
                return
            self.got += len(chunk)
            if self.min_rate > 0:
                self._check(now)
            self.wait_began = now
            yield chunk

    def _check(self, now: float) -> None:
        marks, waited = self.marks, self.waited
        if waited - marks[-1][0] >= self.window / 8:
            marks.append((waited, self.got))
        while len(marks) > 1 and waited - marks[1][0] >= self.window:
            marks.popleft()  # the newest mark at least a window old stays first
        span = waited - marks[0][0]
        if span >= self.window and self.got - marks[0][1] < self.min_rate * span:
            raise Retryable(
                f"below the minimum rate: {self.got - marks[0][1]} bytes in {span:.1f} s "
                f"(min_rate {self.min_rate:g} B/s over {self.window:g} s)",
                since=now - span,
            )


def resuming_chunks(
    url: str,
    open_range: OpenRange,
    start: int,
    end: int | None,
    *,
    policy: RetryPolicy,
    counters: Counters,
    gate: Gate | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """Yield the bytes of ``[start, end)`` of ``url`` (``end`` None: to the object's end).

    ``open_range(pos, end)`` opens a read from ``pos``; it may deliver fewer bytes than
    asked (one range of a configured size), and the loop asks again from where it ended.
    Each request holds ``gate`` (the node's request cap and rate) from before it is sent
    until its body is closed, and tells it how the store answered; never while waiting
    to try again.
    """
    rng = random.Random()
    pos = start
    failures = 0
    clock = _Clock()
    last: Retryable | None = None
    wait = waiting("fetch", url=url, attempt=1)

    def nap(seconds: float) -> None:
        with wait:
            sleep(seconds)

    while end is None or pos < end:
        held = contextlib.ExitStack()
        admission: Admission | None = None
        opened = time.monotonic()
        wait.detail.update(attempt=failures + 1, offset=pos)
        try:
            with wait:
                if gate is not None:
                    admission = _turn(url, gate, held, policy, clock, failures, last)
                    opened = time.monotonic()
                resp = open_range(pos, end)
        except Retryable as exc:
            held.close()
            if admission is not None:
                admission.answered(exc.status, exc.retry_after)
            exc.since = opened if exc.since is None else exc.since
            last = exc
            failures = _failed(url, exc, failures, policy, counters, rng, nap, clock)
            continue
        except BaseException:
            held.close()
            raise
        if admission is not None:
            admission.answered(200)
        pace = _Pace(policy.min_rate, max(0.01, min(policy.window(), clock.left(policy))), opened)
        try:
            if resp.total is not None and (end is None or end > resp.total):
                end = resp.total  # like a file: a read past the end stops at the end
            before = pos
            for chunk in pace.chunks(resp.chunks(), wait):
                pos += len(chunk)
                yield chunk
            if pos == before:
                if end is None:
                    return  # an object of unknown size has ended
                if pos < end:
                    raise Retryable(f"the server sent no bytes at offset {pos} of {end}")
            failures = 0  # a whole answer: the trouble is over
            clock.first = None
        except Retryable as exc:
            resp.close()
            held.close()
            exc.since = pace.wait_began if exc.since is None else exc.since
            last = exc
            failures = _failed(url, exc, failures, policy, counters, rng, nap, clock)
        finally:
            resp.close()
            held.close()


def retried(
    url: str,
    call: Callable[[], T],
    *,
    policy: RetryPolicy,
    counters: Counters,
    gate: Gate | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` (one whole request: a write of a part, a chunk, a block, a commit),
    made again after each :class:`Retryable` failure it raises, under the same policy,
    deadline and gate as a read (see :func:`resuming_chunks`); its result.

    ``call`` must be safe to repeat: it sends the same bytes to the same place, or asks
    the store first where an earlier try ended."""
    rng = random.Random()
    failures = 0
    clock = _Clock()
    last: Retryable | None = None
    while True:
        sent = time.monotonic()
        with contextlib.ExitStack() as held:
            admission = None
            if gate is not None:
                admission = _turn(url, gate, held, policy, clock, failures, last)
                sent = time.monotonic()
            try:
                out = call()
            except Retryable as exc:
                if admission is not None:
                    admission.answered(exc.status, exc.retry_after)
                exc.since = sent if exc.since is None else exc.since
                last = exc
            else:
                if admission is not None:
                    admission.answered(200)
                return out
        failures = _failed(url, last, failures, policy, counters, rng, sleep, clock)


def _turn(
    url: str,
    gate: Gate,
    held: contextlib.ExitStack,
    policy: RetryPolicy,
    clock: _Clock,
    failures: int,
    last: Retryable | None,
) -> Admission | None:
    """Wait for the gate's turn, held by ``held``; a turn past the deadline is the end of
    the read, named as a failure after its retries."""
    try:
        return held.enter_context(gate(clock.until(policy)))
    except NoTurn as exc:
        raise FetchError(
            f"giving up after {clock.spent():.1f} s (the deadline is {policy.deadline:g} s; "
            f"{exc}): {last}",
            url=url,
            status=None if last is None else last.status,
            attempts=failures,
        ) from exc


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
    """Count one failure: wait before the next try, or raise FetchError if out of tries,
    if the wait would end past the deadline, or if the server asks for such a wait."""
    failures += 1
    spent = clock.spent(exc.since)
    wait = policy.delay(failures, exc.retry_after, rng)
    why = ""
    if exc.retry_after is not None and spent + exc.retry_after > policy.deadline:
        why = (
            f" (the server's Retry-After of {exc.retry_after:g} s is past what is left of "
            f"the deadline: {max(0.0, policy.deadline - spent):.1f} s; the deadline is "
            f"{policy.deadline:g} s)"
        )
    elif failures < policy.max_attempts and spent + wait > policy.deadline:
        why = f" (the deadline is {policy.deadline:g} s)"
    if why or failures >= policy.max_attempts:
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
