"""The cache's ledger against the disk: crashes at every point, out-of-band changes, and
several real processes reserving, publishing and evicting at once."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from shardkit.cache import upkeep
from shardkit.cache.layout import CacheKey, FillPieces
from shardkit.cache.ledger import Ledger
from shardkit.cache.store import CacheStore

pytestmark = pytest.mark.integration

SIZE = 99  # a shard; its temp file holds one more byte (the piece map)


def content(n: int) -> bytes:
    return (b"shard %d " % n).ljust(SIZE, b"x")


def key(n: int) -> CacheKey:
    return CacheKey.of("sha256:" + hashlib.sha256(content(n)).hexdigest(), SIZE)


def add(store: CacheStore, n: int, mtime: float | None = None) -> None:
    """Reserve, fill and publish shard ``n`` as a fill does."""
    k = key(n)
    fd, published = store.open_part(k, FillPieces(k.size))
    assert fd is not None and not published
    os.pwrite(fd, content(n), 0)
    os.ftruncate(fd, k.size)
    os.close(fd)
    assert store.publish(k, FillPieces(k.size))
    if mtime is not None:
        os.utime(store.path(k), (mtime, mtime))


def filled(root: Path, n: int, limit: int | None = None, *, aged: bool = False) -> CacheStore:
    """A store holding shards ``0..n-1``, published in that order (``aged``: each used
    at 1000 + i s, so the order holds against shards published later too)."""
    store = CacheStore(str(root), limit=limit)
    for i in range(n):
        add(store, i, mtime=1000.0 + i if aged else None)
    return store


def on_disk(store: CacheStore) -> dict[str, int]:
    return {s.path: s.size for s in store.shards()}


def listed(store: CacheStore) -> dict[str, int]:
    """What a fresh process finds in the ledger (rescanned if it cannot be trusted)."""
    other = CacheStore(store.root)
    other.ensure()
    with other._lock(other.evict_lock_path()):
        ledger = other.ledger()
        return {os.path.join(store.root, rel): size for rel, (size, _) in ledger.entries.items()}


def rescans(store: CacheStore) -> int:
    fresh = Ledger(store.root, store._scan)
    store.ensure()
    with store._lock(store.evict_lock_path()):
        fresh.sync()
    return fresh.rescans


def test_the_ledger_keeps_lru_order_and_the_limit_without_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = filled(tmp_path, 4, limit=4 * 100)
    os.utime(store.path(key(0)))  # read again (a hit, not logged)
    lease = store.lease(store.path(key(1)))  # being read (the least recently used)
    assert lease is not None
    scanned: list[str] = []
    monkeypatch.setattr(store, "shards", lambda: scanned.append("scan") or iter(()))
    add(store, 4)  # needs room for one: 1 is leased, 0 was used since: 2 goes
    add(store, 5)  # then 3
    assert scanned == []  # no reservation looked at data/ as a whole
    monkeypatch.undo()
    gone = {store.path(key(i)) for i in (2, 3)}
    assert not any(os.path.exists(p) for p in gone)
    assert on_disk(store) == listed(store) and store.usage() == 4 * SIZE
    os.close(lease)
    assert rescans(store) == 0  # every change logged: nothing to repair


def test_a_half_written_ledger_is_rescanned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = filled(tmp_path, 3, limit=1000)
    with open(tmp_path / "ledger", "ab") as f:
        f.write(b'0badc0de {"add":[["data/sha256/ab/ab", 10')  # a crash mid-append
    with caplog.at_level(logging.WARNING):
        add(store, 3)
    assert "half-written" in caplog.text
    assert listed(store) == on_disk(store) and len(on_disk(store)) == 4
    (tmp_path / "ledger").write_bytes(b"garbage\n")  # a line not matching its checksum
    assert store.usage() == 4 * SIZE
    assert listed(store) == on_disk(store) and rescans(store) == 0


def _die_in(step: str, root: str, n: int) -> None:
    """In a child process: publish (or evict) shard ``n`` and die half-way through."""
    store = CacheStore(root, limit=300)
    real_replace, real_unlink = os.replace, os.unlink

    def replace(src: str, dst: str) -> None:
        if step == "before rename":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
        if step == "after rename":
            os.kill(os.getpid(), signal.SIGKILL)

    def unlink(path: str) -> None:
        real_unlink(path)
        if step == "after unlink" and "/data/" in path:
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace, os.unlink = replace, unlink  # type: ignore[assignment]
    add(store, n)


@pytest.mark.parametrize("step", ["before rename", "after rename", "after unlink"])
def test_a_process_killed_in_a_change_leaves_a_ledger_that_is_repaired(
    tmp_path: Path, step: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = filled(tmp_path, 3, limit=300, aged=True)  # full: the child's evicts shard 0
    child = multiprocessing.get_context("spawn").Process(
        target=_die_in, args=(step, str(tmp_path), 9)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    # a published shard not listed, a listed one gone, or a begun publish never made
    with caplog.at_level(logging.WARNING):
        assert store.usage() == sum(on_disk(store).values()) + sum(p.size for p in store.parts())
    assert "never ended" in caplog.text
    assert listed(store) == on_disk(store)
    assert os.path.exists(store.path(key(9))) == (step == "after rename")
    assert not os.path.exists(store.path(key(0)))
    add(store, 10)  # and the cache goes on, within its limit
    assert store.usage() <= 300 and listed(store) == on_disk(store)


def test_changes_behind_the_ledgers_back_are_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = filled(tmp_path, 3, limit=1000)
    # a shard copied in by hand: found when it is opened
    stray = key(7)
    Path(store.path(stray)).parent.mkdir(parents=True, exist_ok=True)
    Path(store.path(stray)).write_bytes(content(7))
    fd, published = store.open_part(stray, FillPieces(SIZE))
    assert fd is not None and published
    os.close(fd)
    assert listed(store) == on_disk(store) and len(on_disk(store)) == 4
    # one removed by hand: found when it is wanted again
    os.unlink(store.path(key(1)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        add(store, 1)
    assert "not in the ledger, or one in it is gone" in caplog.text
    assert listed(store) == on_disk(store)
    # or when eviction comes to it
    tight = CacheStore(str(tmp_path), limit=4 * 100)
    for i in (0, 2):
        os.utime(store.path(key(i)), (10.0 + i, 10.0 + i))
    os.unlink(store.path(key(0)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        add(tight, 8)
        add(tight, 9)
    assert "gone" in caplog.text
    assert listed(store) == on_disk(store) and tight.usage() <= 400
    # a ledger from before the last boot is not trusted (its tail may not be on disk)
    path = tmp_path / "ledger"
    lines = path.read_bytes().split(b"\n", 1)
    path.write_bytes(lines[0].replace(b'"boot":"', b'"boot":"x') + b"\n" + lines[1])
    assert rescans(store) == 1


def test_stat_clean_and_verify_agree_with_the_disk(tmp_path: Path) -> None:
    store = filled(tmp_path, 4, aged=True)
    Path(store.path(key(7))).parent.mkdir(parents=True, exist_ok=True)
    Path(store.path(key(7))).write_bytes(content(7))  # not in the ledger
    os.unlink(store.path(key(0)))  # in the ledger, gone
    st = upkeep.stat(store)
    assert st.shards == 4 and st.bytes == 4 * SIZE
    assert listed(store) == on_disk(store)
    assert upkeep.clean(store, keep=2 * SIZE) == (2, 2 * SIZE)
    assert listed(store) == on_disk(store) and store.usage() == 2 * SIZE
    assert upkeep.scrub(store) == []
    assert listed(store) == on_disk(store)


def _churn(root: str, seed: int, rounds: int) -> None:
    """In a child process: open, fill and publish random shards of a small pool."""
    store = CacheStore(root, limit=10 * 100)
    rng = random.Random(seed)
    for _ in range(rounds):
        n = rng.randrange(30)
        k = key(n)
        fd, published = store.open_part(k, FillPieces(k.size))
        if fd is None:
            continue  # no room: every shard is being read
        if published:
            os.utime(fd)
            time.sleep(rng.random() / 1000)  # read it a while, leased
            os.close(fd)
            continue
        os.pwrite(fd, content(n), 0)
        os.ftruncate(fd, k.size)
        os.close(fd)
        store.publish(k, FillPieces(k.size))
        assert store.usage() <= 10 * 100


def test_processes_at_once_keep_the_ledger_exact_and_the_limit(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_churn, args=(str(tmp_path), s, 150)) for s in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    store = CacheStore(str(tmp_path))
    assert rescans(store) == 0  # no process ever found it wrong
    assert listed(store) == on_disk(store)
    assert sum(on_disk(store).values()) <= 10 * 100
    assert list(store.parts()) == []


def test_processes_killed_at_random_leave_a_cache_that_is_repaired(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(5)
    for round_ in range(3):
        seeds = [10 * round_ + s for s in range(3)]
        procs = [ctx.Process(target=_churn, args=(str(tmp_path), s, 10**6)) for s in seeds]
        for p in procs:
            p.start()
        ledger, size = tmp_path / "ledger", 0
        for _ in range(600):  # until they are at work (spawned processes start slowly)
            time.sleep(0.1)
            if ledger.exists() and size and ledger.stat().st_size > size:
                break
            size = ledger.stat().st_size if ledger.exists() else 0
        time.sleep(rng.random())
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
            p.join(30)
        store = CacheStore(str(tmp_path), limit=10 * 100)
        assert listed(store) == on_disk(store)  # rescanned if a kill fell in a change
        assert store.usage() <= 10 * 100
        store.sweep()
