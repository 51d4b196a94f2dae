"""Hostile review of issue 32 (the node's request rate): a peer process stopped while it
holds the rate file's lock never hangs a read or a write past its bound; the job's budget
and a fixed node_rate hold over what a throttle or an earlier run left; a garbled rate
file is taken as none."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkit._types import ObjectRef
from shardkit.cache.opener import CachingOpener
from shardkit.errors import CacheError, FetchError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, RetryPolicy
from shardkit.io.config import IoConfig
from shardkit.io.rate import NodeRate
from shardkit.io.retry import NoTurn
from tests.helpers.servers import RangeServer

_HOLD = (
    "import fcntl, os, signal, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "os.kill(os.getpid(), signal.SIGSTOP)\n"
)


@pytest.fixture
def stopped_holder() -> Iterator[Callable[[str], int]]:
    """A peer process of the node that takes a file's flock and is SIGSTOPped holding it."""
    procs: list[subprocess.Popen[str]] = []

    def hold(path: str) -> int:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        p = subprocess.Popen([sys.executable, "-c", _HOLD, path], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == "held\n"
        return p.pid

    yield hold
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        if p.stdout is not None:
            p.stdout.close()


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread: what it raised (None: it returned); fails if it is still
    running after ``seconds`` (a hang)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still waiting after {seconds} s: a stopped peer's lock hangs it"
    return out[0]


@pytest.mark.timeout(30)
def test_a_stopped_peer_holding_the_rate_lock_does_not_hang_the_rate(
    tmp_path: Path, stopped_holder: Callable[[str], int]
) -> None:
    """NodeRate.admit waits for the lock no longer than its turn may be waited for (its
    ``wait``, or the read's deadline), and names the file and the process holding it."""
    path = str(tmp_path / "slots" / "rate")
    pid = stopped_holder(path)
    rate = NodeRate(path, start=5.0, wait=1.0)
    start = time.monotonic()
    err = _within(4.0, rate.admit)
    assert isinstance(err, CacheError), err
    assert time.monotonic() - start < 2.0
    assert path in str(err) and str(pid) in str(err), err
    err = _within(4.0, lambda: rate.admit(time.monotonic() + 0.5))
    assert isinstance(err, CacheError), err


@pytest.mark.timeout(30)
def test_a_stopped_peer_holding_the_rate_lock_does_not_hang_a_cached_read(
    make_shards: Callable[..., Manifest], tmp_path: Path, stopped_holder: Callable[[str], int]
) -> None:
    """A cache fill while a stopped process of the node holds ``slots/rate``: it ends
    (read, or a named error) within cache_wait, never waits for ever."""
    data = make_shards([2], tokens=8)
    e = data.shards[0]
    opener = CachingOpener(
        IoConfig(
            cache=CacheConfig(cache_dir=tmp_path / "c", cache_wait=1.0, node_rate=5.0),
            retry=RetryPolicy(deadline=1.0),
        )
    )
    stopped_holder(opener.gate.rate.path)
    with RangeServer(str(data.base)) as srv:
        url = srv.url(e.url)
        err = _within(4.0, lambda: opener.ensure_cached(ObjectRef(url, e.size, e.checksum)))
    assert err is None or isinstance(err, (CacheError, FetchError)), err


def test_a_cut_never_lifts_a_node_above_its_share_of_the_job_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """request_rate=1 over 4 nodes: each node's share is 0.25/s. A throttled answer set the
    rate to the floor (1/s): every node 4x its share, the job 4x its budget."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    opener = CachingOpener(IoConfig(cache=CacheConfig(cache_dir=tmp_path / "c", request_rate=1)))
    assert opener.gate.rate.rate() == pytest.approx(0.25)
    opener.gate.rate.admit().answered(429)
    assert 0 < opener.gate.rate.rate() <= 0.25


def test_a_job_budget_holds_over_the_state_an_earlier_run_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run restarted within minutes with request_rate set finds the node's rate file of
    the run before (16/s): the new share (0.25/s) was ignored until the state went idle
    (10 minutes), every request let through at the old rate."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    cache = tmp_path / "c"
    before = CachingOpener(
        IoConfig(cache=CacheConfig(cache_dir=cache, node_rate=16.0, rate_adapt=False))
    )
    before.gate.rate.admit()
    assert before.gate.rate.rate() == 16.0
    opener = CachingOpener(IoConfig(cache=CacheConfig(cache_dir=cache, request_rate=1)))
    assert opener.gate.rate.rate() == pytest.approx(0.25)
    opener.gate.rate.admit()
    with pytest.raises(NoTurn):  # the next turn is 1/0.25 s after the first's
        opener.gate.rate.admit(time.monotonic() + 3.0)


def test_a_fixed_node_rate_is_the_rate_over_an_earlier_runs_state(tmp_path: Path) -> None:
    """rate_adapt=False keeps the rate at node_rate: a run restarted within 10 minutes with
    node_rate=2 was paced at the 16/s the run before left in the node's rate file."""
    cache = tmp_path / "c"
    before = CachingOpener(
        IoConfig(cache=CacheConfig(cache_dir=cache, node_rate=16.0, rate_adapt=False))
    )
    before.gate.rate.admit()
    opener = CachingOpener(
        IoConfig(cache=CacheConfig(cache_dir=cache, node_rate=2.0, rate_adapt=False))
    )
    assert opener.gate.rate.rate() == 2.0
    opener.gate.rate.admit()
    with pytest.raises(NoTurn):  # the next turn is 1/2 s after the first's
        opener.gate.rate.admit(time.monotonic() + 0.3)


@pytest.mark.parametrize(
    "state",
    [
        (float("nan"), 1e308, float("nan"), float("nan"), 0.0, float("nan"), 0.0, 0.0),
        (-5.0, "now", "now", "now", 0.0, "now", 0.0, 0.0),
        (1.0, "ahead", "now", "now", 1.0, "now", 1.0, 1.0),
    ],
)
def test_a_garbled_rate_file_starts_afresh(tmp_path: Path, state: tuple[Any, ...]) -> None:
    """The node's rate file holding what no run of this version writes (NaN or infinite
    times, a negative rate, a turn hours ahead: bit rot, another version's layout): every
    read and write of the node was refused ('no turn within 300 s') for ever (NaN times
    never go idle) or for 10 minutes; it is taken as no state."""
    path = tmp_path / "slots" / "rate"
    path.parent.mkdir()
    now = time.monotonic()
    values = [{"ahead": now + 500.0, "now": now}.get(v, v) for v in state]
    path.write_bytes(struct.pack("<8d", *values))
    rate = NodeRate(str(path), start=5.0)
    rate.admit(time.monotonic() + 0.5)
    assert rate.rate() == 5.0
