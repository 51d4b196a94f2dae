"""The node's request rate: one AIMD rate shared by every process and worker on the node.

A store that is asked too much answers 429 or 503 (S3's ``SlowDown``). Each node then
lowers its rate multiplicatively (by ``CUT``) and raises it again additively while its
requests are served, as TCP does with its window: several nodes that never talk to each
other settle on fair shares of what the store serves. The rate starts at ``start``
requests per second (the cache starts it at ``node_rate``, else at ``node_requests`` per
second) and doubles every second its requests are served and held back by it, until the
store first throttles (a slow start, as TCP's); 0: no pacing until then, when the rate
becomes ``CUT`` times the rate this node was making.

The state is 64 bytes in a file of the cache dir (``slots/rate``), read and written under
its ``flock``, so every process and thread on the node paces against one schedule: a
request is given the next free start time (``1/rate`` after the one before) and sleeps
until it, outside the lock. A throttled answer lowers the rate once per round: only a
request admitted after the last cut, and ``ROUND`` seconds after it, may cut again (the
answers of requests already in flight at the old rate say nothing new). The server's
``Retry-After`` is the floor of the wait of the request that got it
(:mod:`shardkit.io.retry`); the node's schedule is not paused by it, so the other
requests of the node keep the pace the store can serve.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from shardkit.activity import lock_holders
from shardkit.counters import Counters
from shardkit.errors import CacheError
from shardkit.io.retry import NoTurn

__all__ = ["CUT", "FLOOR", "THROTTLED", "Admission", "NodeRate"]

CUT = 0.5  # the multiplicative decrease on a throttled answer
# the additive increase per second: this share of the rate before the last cut (at least
# 1/s), growing with the time since that cut (up to 8x), so a node cut deep, or left alone
# when the others end, climbs back in seconds
RAISE = 0.1
FLOOR = 1.0  # requests per second a node never goes below (but for a smaller share: cap)
# the shortest round between two cuts: a store throttles over about a second, so the answers
# of the next few requests still say "too much" while the other nodes have not cut yet
ROUND = 0.5
THROTTLED = frozenset({429, 503})  # the answers that lower the rate (S3's SlowDown is a 503)
_IDLE = 600.0  # a state older than this (or from another boot) starts afresh
_ADJUST_WAIT = 1.0  # seconds a cut or raise waits for the lock before it is left undone

# rate, next start, last cut, last raise, the rate before the last cut, window start,
# requests in the window, the last window's rate
_STATE = struct.Struct("<8d")


@dataclass
class _State:
    rate: float = 0.0  # 0: no pacing
    next_at: float = 0.0
    last_cut: float = 0.0
    last_raise: float = 0.0
    ceiling: float = 0.0
    window: float = 0.0
    count: float = 0.0
    seen: float = 0.0

    def observed(self, now: float) -> float:
        """Requests per second this node was making lately."""
        span = now - self.window
        return max(self.seen, self.count / max(span, 0.05))


class Admission:
    """One request let through the node's rate: report how the store answered it."""

    def __init__(self, rate: NodeRate, admitted: float, waited: bool) -> None:
        self._rate = rate
        self._admitted = admitted
        self._waited = waited
        self._told = False

    def answered(self, status: int | None, retry_after: float | None = None) -> None:
        """The store answered ``status`` (None: no answer, a broken body: says nothing of
        the rate); a throttled answer lowers the rate, a served one raises it."""
        del retry_after  # the floor of this request's own wait, not of the node's
        if self._told or status is None:
            return
        self._told = True
        if status in THROTTLED:
            self._rate.cut(self._admitted)
        elif status < 400 and self._waited:
            self._rate.raise_(self._admitted)


class NodeRate:
    """The node's AIMD request rate (see the module docstring).

    Args:
        path: the state file (its directory is made if missing).
        start: requests per second to start from (0: no pacing until the first throttle).
        adapt: False keeps the rate at ``start`` (0: no pacing at all).
        wait: seconds a request may be scheduled ahead before :class:`CacheError`
            (:class:`NoTurn` when its turn falls past the read's deadline).
        counters: where cuts and waits are counted (``rate_cuts``, ``rate_wait_s``).
        cap: requests per second the rate never goes above (0: none): this node's share
            of a job-wide budget.
    """

    def __init__(
        self,
        path: str,
        *,
        start: float = 0.0,
        adapt: bool = True,
        wait: float = 300.0,
        counters: Counters | None = None,
        cap: float = 0.0,
    ) -> None:
        self.path = path
        self.start = min(start, cap) if start > 0 and cap > 0 else (start or cap)
        self.adapt = adapt
        self.wait = wait
        self.counters = counters or Counters()
        self.cap = cap

    def __getstate__(self) -> dict[str, object]:
        return dict(self.__dict__)

    @contextlib.contextmanager
    def gate(self, until: float | None = None) -> Iterator[Admission]:
        """Wait for this request's turn (see :meth:`admit`); the admission reports how it
        was answered."""
        yield self.admit(until)

    def admit(self, until: float | None = None) -> Admission:
        """Take the next start time of the node's schedule and sleep until it.

        ``until`` (a :func:`time.monotonic` time): a turn later than that is not waited
        for (:class:`CacheError`), nor is one more than ``wait`` seconds ahead.
        """
        if not self.adapt and self.start <= 0:
            return Admission(self, time.monotonic(), False)
        bound = time.monotonic() + self.wait
        with self._state(bound if until is None else min(until, bound), until) as (st, now):
            at = now if st.rate <= 0 else max(now, st.next_at)
            if at > now + self.wait or (until is not None and at > until):
                why = f"the node's request rate ({st.rate:.2f}/s, {self.path}) has no turn "
                if until is not None and at > until:
                    raise NoTurn(why + f"before the read's deadline ({until - now:.1f} s)")
                raise CacheError(why + f"within {self.wait:g} s")
            if st.rate > 0:
                st.next_at = at + 1.0 / st.rate
            st.count += 1
        if at > now:
            self.counters.add("rate_wait_s", at - now)
            time.sleep(at - now)
        return Admission(self, at, at > now)

    def cut(self, admitted: float) -> None:
        """A throttled answer to a request admitted at ``admitted``: lower the rate, once
        per round."""
        if not self.adapt:
            return
        with _undone(), self._state(time.monotonic() + _ADJUST_WAIT) as (st, now):
            if admitted < st.last_cut or now - st.last_cut < ROUND:
                return  # sent at the old rate, or in the same round: that rate is cut already
            before = st.rate if st.rate > 0 else st.observed(now)
            floor = min(FLOOR, self.cap) if self.cap > 0 else FLOOR  # never past the share
            st.ceiling = max(before, floor)
            st.rate = max(floor, CUT * before)
            if self.cap > 0:
                st.rate = min(st.rate, self.cap)
            st.last_cut = st.last_raise = now
            st.next_at = max(st.next_at, now + 1.0 / st.rate) if before > 0 else now
        self.counters.add("rate_cuts")

    def raise_(self, admitted: float) -> None:
        """A served answer to a request that waited its turn (the rate held the node
        back): raise the rate additively, in proportion to the time since the last raise
        (doubling it every second before the store first throttled: a slow start)."""
        if not self.adapt:
            return
        with _undone(), self._state(time.monotonic() + _ADJUST_WAIT) as (st, now):
            if st.rate <= 0 or admitted < st.last_cut:
                return
            if st.ceiling > 0:
                step = max(1.0, RAISE * st.ceiling) * min(8.0, 1.0 + (now - st.last_cut) / 2)
            else:
                step = st.rate  # slow start: doubling every second until the first cut
            st.rate += step * min(2.0, now - st.last_raise)
            if self.cap > 0:
                st.rate = min(st.rate, self.cap)
            st.last_raise = now

    def rate(self) -> float:
        """The node's rate now (requests per second; 0: no pacing)."""
        with self._state(time.monotonic() + self.wait) as (st, _):
            return st.rate

    @contextlib.contextmanager
    def _state(self, by: float, until: float | None = None) -> Iterator[tuple[_State, float]]:
        """The node's state under its lock, written back when the block ends; the lock is
        waited for until ``by`` (a :func:`time.monotonic` time), then :class:`CacheError`
        naming who holds it (:class:`NoTurn` when ``by`` is the read's deadline
        ``until``): a process of the node stopped or stuck holding it never hangs us."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        began = time.monotonic()
        with _locked(self.path, by) as fd:
            if fd is None:
                waited = time.monotonic() - began
                held = ", ".join(map(str, lock_holders(self.path, 0))) or "another process"
                why = (
                    f"the node's request rate ({self.path}) stayed locked by pid {held} "
                    f"for {waited:.1f} s: a process of the node is stopped or stuck "
                    "holding it; resume or end it"
                )
                if until is not None and by >= until:
                    raise NoTurn(why + " (the read's deadline came)")
                raise CacheError(why + f" (waited {self.wait:g} s for a turn)")
            raw = os.pread(fd, _STATE.size, 0)
            now = time.monotonic()
            st = _State(*_STATE.unpack(raw)) if len(raw) == _STATE.size else None
            if st is not None and not _sane(st, now, self.wait):
                st = None  # garbled (bit rot, another version's layout): no state
            updated = 0.0 if st is None else max(st.window, st.last_raise, st.last_cut)
            if st is None or updated > now or now - updated > _IDLE:  # new, rebooted, idle
                st = _State(rate=self.start, window=now, last_raise=now)
            if not self.adapt:  # a fixed rate is this run's, not what a state file says
                st.rate = self.start
            if self.cap > 0 and not 0 < st.rate <= self.cap:  # a state left by a run without
                st.rate = self.cap  # this budget (or with a larger one): the share holds now
            if now - st.window >= 1.0:
                st.seen = st.count / (now - st.window)
                st.window, st.count = now, 0.0
            yield st, now
            os.pwrite(fd, _STATE.pack(*vars(st).values()), 0)


def _sane(st: _State, now: float, wait: float) -> bool:
    """Whether ``st`` is a state this module could have written: finite numbers, a rate
    and counts >= 0, and no turn further ahead than a request may wait (``wait``) and
    one interval of its rate."""
    if not all(math.isfinite(v) for v in vars(st).values()):
        return False
    ahead = wait + (1.0 / st.rate if st.rate > 0 else 0.0)
    return min(st.rate, st.count, st.seen, st.ceiling) >= 0 and st.next_at <= now + ahead


_HELD: set[int] = set()  # lock fds this process holds: a forked child closes its copies
_HOOKED: list[bool] = []


def _close_inherited() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)  # else the child's copy would hold the node's lock for ever
    _HELD.clear()


_POLL_MAX = 0.05  # the longest sleep between two tries of a lock


@contextlib.contextmanager
def _undone() -> Iterator[None]:
    """A cut or raise that finds the lock held past its short wait is left undone."""
    with contextlib.suppress(CacheError):
        yield


@contextlib.contextmanager
def _locked(path: str, by: float) -> Iterator[int | None]:
    """``path`` open and ``flock``ed for the block (every process of the node, any
    thread); None when the lock is still held by another at ``by`` (monotonic)."""
    if not _HOOKED:
        os.register_at_fork(after_in_child=_close_inherited)
        _HOOKED.append(True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _HELD.add(fd)
    try:
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= by:
                    yield None
                    return
                time.sleep(min(pause, max(0.0, by - time.monotonic())))
                pause = min(_POLL_MAX, pause * 2)
        yield fd
    finally:
        _HELD.discard(fd)
        os.close(fd)  # the only fd of its description: the lock goes with it
