"""Reads and calls run under a :class:`~shardkit.io.retry.RetryPolicy` and its clock.

:func:`resuming_chunks` turns a source's ranged reads into one contiguous stream of
``[start, end)``: after a :class:`~shardkit.io.retry.Retryable` failure it waits (exponential
backoff with jitter, or the server's ``Retry-After``) and asks again from the first byte it
has not delivered. :func:`retried` makes one whole request (a write) again the same way.

**The clock.** A read is in trouble from the moment it stops getting its bytes at the
minimum rate: a request that fails (from when it was sent), a body that breaks or stalls
(from the last byte it gave), or a body that trickles - fewer than ``min_rate`` bytes per
second over ``rate_window`` seconds of waiting on the server (as curl's ``--speed-limit``/
``--speed-time``; the window is never longer than the deadline, or than what is left of
it). A slow trickle is a failure like a drop: the request is given up and asked again from
its last byte. The read gives up with :class:`FetchError` (naming the url, the offset,
the attempts and the time spent) after ``max_attempts`` failures in a row without
progress, or once ``deadline`` seconds have passed since its trouble began, whichever comes
first; a wait that would end past the deadline is not begun, and a ``Retry-After`` past
what is left of it fails at once, naming it. A request that delivers all it was asked for
ends the trouble, and so does progress: once the read has ``min_progress`` bytes more than
at its last progress, the failure that follows is the first of a new trouble (its count,
backoff and deadline start again). So a long object arrives whole over a link that keeps
dropping, while a server that sends a byte and drops is given up after ``max_attempts``
tries: a read makes at most ``max_attempts`` failed tries per ``min_progress`` bytes.
Time the consumer spends between chunks is its own, never the server's: a reader paused
by a slow training step is not a slow server. So ``deadline`` bounds the wall time a read
spends without progress at the minimum rate; a server that keeps the rate is progress,
however long the object (defaults: 1 KiB/s over 30 s, as ``curl -Y 1024 -y 30``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from shardkit.activity import waiting
from shardkit.counters import Counters
from shardkit.errors import FetchError
from shardkit.io.retry import (
    Admission,
    Gate,
    NoTurn,
    OpenRange,
    Retryable,
    RetryPolicy,
    retry_kind,
)

__all__ = ["resuming_chunks", "retried"]

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    tries = 0
    mark = start  # where the read was at its last progress

    def failed(exc: Retryable) -> int:
        nonlocal mark
        if pos - mark >= policy.min_progress:  # progress since the last: a new trouble
            mark, clock.first = pos, None
            return _failed(url, exc, 0, policy, counters, rng, nap, clock, at=(pos, 0, tries))
        at = (pos, pos - mark, tries)
        return _failed(url, exc, failures + 1, policy, counters, rng, nap, clock, at=at)

    def nap(seconds: float) -> None:
        with wait:
            sleep(seconds)

    while end is None or pos < end:
        held = contextlib.ExitStack()
        admission: Admission | None = None
        opened = time.monotonic()
        wait.detail.update(attempt=failures + 1, offset=pos)
        tries += 1
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
            failures = failed(exc)
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
            mark = pos
        except Retryable as exc:
            resp.close()
            held.close()
            exc.since = pace.wait_began if exc.since is None else exc.since
            last = exc
            failures = failed(exc)
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
        failures = _failed(url, last, failures + 1, policy, counters, rng, sleep, clock)


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
    *,
    at: tuple[int, int, int] | None = None,
) -> int:
    """After a failure, ``failures`` of them in a row without progress (0: this one came
    after progress): wait before the next try, or raise FetchError if out of tries, if the
    wait would end past the deadline, or if the server asks for such a wait. ``at``: a
    read's offset, the bytes it gained since its last progress and its tries in all, named
    in the error."""
    spent = clock.spent(exc.since)
    wait = policy.delay(max(1, failures), exc.retry_after, rng)
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
        said = "" if str(exc) == f"HTTP {exc.status}" else f": {exc}"  # FetchError says it
        where = ""
        if at is not None:
            where = f" at offset {at[0]}"
            if not why:  # out of tries: say what progress is
                why = (
                    f" (no progress: the last {failures} tries brought {at[1]} bytes, under "
                    f"min_progress's {policy.min_progress}; {at[2]} tries in all)"
                )
        raise FetchError(
            f"giving up after {spent:.1f} s{where}{why}{said}",
            url=url,
            status=exc.status,
            attempts=max(1, failures),
        ) from exc
    counters.add("retries")
    counters.add(f"retries_{retry_kind(exc.status)}")
    log.info("%s: %s; retry %d in %.2fs", url, exc, failures, wait)
    sleep(wait)
    return failures
