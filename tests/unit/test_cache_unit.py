"""Pure pieces of io and cache: retry policy, resume loop, config, keys, store, locks."""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import hashlib
import io
import os
import pickle
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import shardkit.cache.store as store_module
from shardkit.cache.fill import Fill, run_fill
from shardkit.cache.locks import NodeSlots, is_locked, try_lock, unlock
from shardkit.cache.store import CachedShard, CacheKey, CacheStore
from shardkit.errors import ChecksumError, ConfigError, FetchError
from shardkit.io.config import IoConfig
from shardkit.io.remote import ChunkStream
from shardkit.io.retry import (
    Counters,
    Retryable,
    RetryPolicy,
    parse_retry_after,
    resuming_chunks,
)

DATA = bytes(random.Random(7).randrange(256) for _ in range(10_000))


class FakeBody:
    """An in-memory ranged response that can break after ``fail_after`` bytes."""

    def __init__(self, pos: int, end: int | None, fail_after: int | None, chunk: int) -> None:
        self.total = len(DATA)
        self.pos, self.end = pos, min(end or len(DATA), len(DATA))
        self.fail_after, self.chunk = fail_after, chunk

    def chunks(self) -> Iterator[bytes]:
        sent = 0
        while self.pos < self.end:
            if self.fail_after is not None and sent >= self.fail_after:
                raise Retryable("connection reset")
            piece = DATA[self.pos : min(self.end, self.pos + self.chunk)]
            self.pos += len(piece)
            sent += len(piece)
            yield piece

    def close(self) -> None:
        pass


class FakeSource:
    """Serves DATA; ``script`` says per call: an int (break after that many bytes),
    None (serve to the end) or a Retryable to raise before any byte."""

    def __init__(self, script: list[object]) -> None:
        self.script = script
        self.calls: list[int] = []

    def __call__(self, pos: int, end: int | None) -> FakeBody:
        self.calls.append(pos)
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Retryable):
            raise step
        return FakeBody(pos, end, step if isinstance(step, int) else None, 1000)


def run(src: FakeSource, start: int = 0, end: int | None = None, attempts: int = 4) -> tuple:
    sleeps: list[float] = []
    counters = Counters()
    policy = RetryPolicy(max_attempts=attempts, backoff_base=0.1, backoff_max=1.0)
    data = b"".join(
        resuming_chunks(
            "mem://x", src, start, end, policy=policy, counters=counters, sleep=sleeps.append
        )
    )
    return data, sleeps, counters.snapshot()


def test_resume_from_the_last_byte_after_drops() -> None:
    src = FakeSource([2500, 3000, None])
    data, sleeps, stats = run(src)
    assert data == DATA
    assert src.calls == [0, 3000, 6000]  # whole chunks delivered before each drop are kept
    assert stats == {"retries": 2, "retries_connection": 2} and len(sleeps) == 2


def test_a_range_and_a_read_past_the_end() -> None:
    data, _, _ = run(FakeSource([1500, None]), start=1234, end=5678)
    assert data == DATA[1234:5678]
    data, _, _ = run(FakeSource([]), start=9990, end=20_000)
    assert data == DATA[9990:]


def test_gives_up_after_max_attempts_without_progress() -> None:
    src = FakeSource([Retryable("HTTP 503", status=503)] * 10)
    with pytest.raises(FetchError) as info:
        run(src, attempts=3)
    assert info.value.attempts == 3 and info.value.status == 503
    assert info.value.url == "mem://x" and "HTTP 503" in str(info.value)
    assert len(src.calls) == 3


def test_progress_resets_the_attempt_count() -> None:
    # every response breaks, but each one delivers bytes: 2 tries in a row never fail
    src = FakeSource([1000] * 20)
    data, sleeps, stats = run(src, attempts=2)
    assert data == DATA and stats["retries"] == 9 and len(sleeps) == 9


def test_retry_after_is_honoured_and_capped() -> None:
    src = FakeSource([Retryable("HTTP 429", status=429, retry_after=7.0), None])
    _, sleeps, _ = run(src)
    assert 7.0 <= sleeps[0] <= 7.1
    policy = RetryPolicy(backoff_base=0.1, retry_after_max=2.0)
    assert policy.delay(1, 3600.0, random.Random(0)) <= 2.1


def test_backoff_grows_exponentially_with_jitter() -> None:
    policy = RetryPolicy(backoff_base=0.5, backoff_max=4.0)
    rng = random.Random(1)
    for failures, step in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        delays = [policy.delay(failures, None, rng) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays)
        assert max(delays) - min(delays) > step / 4  # jittered, not fixed


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (parse_retry_after(when) or 0) <= 31


def test_io_config_options() -> None:
    cfg = IoConfig.make(cache_limit="1GB", range_size="8MiB", read_timeout=5)
    assert cfg.cache_limit == 10**9 and cfg.range_size == 8 << 20 and cfg.read_timeout == 5
    with pytest.raises(ConfigError, match="unknown io options"):
        IoConfig.make(rnage_size=1)
    with pytest.raises(ConfigError, match="read_timeout"):
        IoConfig(read_timeout=0)
    with pytest.raises(ConfigError, match="on_cache_error"):
        IoConfig(on_cache_error="ignore")


def test_counters_count_this_process_only() -> None:
    c = Counters()
    c.add("requests", 2)
    assert c.snapshot() == {"requests": 2}
    assert pickle.loads(pickle.dumps(c)).snapshot() == {}


def test_chunk_stream_verifies_a_whole_read() -> None:
    checksum = "sha256:" + hashlib.sha256(DATA).hexdigest()
    ok = ChunkStream(iter([DATA[:10], DATA[10:]]), url="u", size=len(DATA), checksum=checksum)
    assert io.BufferedReader(ok).read() == DATA
    bad = DATA[:50] + b"x" + DATA[51:]
    with pytest.raises(ChecksumError, match="checksum differs") as info:
        io.BufferedReader(ChunkStream(iter([bad]), url="u", checksum=checksum)).read()
    assert info.value.expected == checksum and info.value.url == "u"
    with pytest.raises(ChecksumError, match="size differs"):
        io.BufferedReader(ChunkStream(iter([DATA[:-1]]), url="u", size=len(DATA))).read()


def test_cache_key_is_content_addressed_and_refuses_odd_digests() -> None:
    key = CacheKey.of("sha256:" + "ab" * 32, 100)
    store = CacheStore("/cache")
    assert store.path(key) == f"/cache/data/sha256/ab/{'ab' * 32}"
    with pytest.raises(ConfigError, match="hex"):
        CacheKey.of("sha256:../../../etc/passwd", 1)


def put(store: CacheStore, n: int, size: int, mtime: float) -> CacheKey:
    """A cached shard written straight into the store (as a publish would leave it)."""
    key = CacheKey.of("sha256:" + hashlib.sha256(bytes([n])).hexdigest(), size)
    path = Path(store.path(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(size))
    os.utime(path, (mtime, mtime))
    return key


def reserve(store: CacheStore, key: CacheKey) -> bool:
    fd = store.reserve(key)
    if fd is None:
        return False
    os.close(fd)
    os.unlink(store.part_path(key))
    return True


def test_eviction_is_lru_and_spares_leased_shards(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path), limit=300)
    store.ensure()
    old, mid, new = (put(store, i, 100, 1000.0 + i) for i in range(3))
    lease = store.open_published(old)  # being read; also makes it the most recent
    assert lease is not None
    assert reserve(store, put_key(3))
    assert os.path.exists(store.path(old)) and not os.path.exists(store.path(mid))
    assert os.path.exists(store.path(new))
    os.utime(store.path(new), (5000.0, 5000.0))  # read again: now the newest
    assert not reserve(store, put_key(4, size=250))  # only the leased one could make room
    assert os.path.exists(store.path(new))  # a reservation that cannot fit evicts nothing
    os.close(lease)
    assert reserve(store, put_key(4, size=250))
    assert not os.path.exists(store.path(old))
    assert store.usage() <= 300
    assert not reserve(store, put_key(5, size=301))  # larger than the whole cache


def put_key(n: int, size: int = 100) -> CacheKey:
    return CacheKey.of("sha256:" + hashlib.sha256(bytes([n])).hexdigest(), size)


def test_dead_parts_are_removed_live_ones_counted(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path), limit=1000)
    store.ensure()
    dead, live, mine = put_key(1, 400), put_key(2, 400), put_key(3, 500)
    Path(store.part_path(dead)).write_bytes(b"x")  # its process died: nobody holds the lock
    Path(store.part_path(live)).write_bytes(b"y")
    live_lock = store.try_download_lock(live)
    my_lock = store.try_download_lock(mine)
    assert live_lock is not None and my_lock is not None
    assert store.downloading(live) and not store.downloading(dead)
    fd = store.reserve(mine)  # 400 (live) + 500 fits once the dead 400 is gone
    assert fd is not None
    assert not os.path.exists(store.part_path(dead))
    assert os.path.exists(store.part_path(live)) and os.path.exists(store.part_path(mine))
    assert not reserve(store, put_key(4, 200))  # 400 + 500 reserved by live downloads
    unlock(live_lock)  # that download died: its temp file is garbage now
    assert reserve(store, put_key(4, 200))
    assert not os.path.exists(store.part_path(live))
    os.close(fd)
    unlock(my_lock)


def telling_waits(name: str, waits: threading.Event) -> Callable[..., Any]:
    """The store's ``locked``, which sets ``waits`` when thread ``name`` has to wait."""
    real = store_module.locked

    @contextlib.contextmanager
    def probed(path: str, *, exclusive: bool = True) -> Iterator[int]:
        if threading.current_thread().name == name:
            free = try_lock(path, exclusive=exclusive)
            if free is None:
                waits.set()
            else:
                unlock(free)
        with real(path, exclusive=exclusive) as fd:
            yield fd

    return probed


def test_an_eviction_never_falls_between_opening_a_shard_and_leasing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader stopped after its open and before its lock, and an eviction that wants the
    # shard: evicting it then would unlink bytes the reader keeps on disk, uncounted.
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    shard = put(store, 1, 100, 1000.0)
    inode = os.stat(store.path(shard)).st_ino
    opened, go, decided = threading.Event(), threading.Event(), threading.Event()
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if threading.current_thread().name == "reader" and os.fstat(fd).st_ino == inode:
            opened.set()
            assert go.wait(30)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(store_module, "locked", telling_waits("evictor", decided))
    leases: list[int | None] = []
    reserved: list[int | None] = []

    def evict() -> None:
        try:
            reserved.append(store.reserve(put_key(2, 200)))  # fits only without the shard
        finally:
            decided.set()  # or it did not wait

    reader = threading.Thread(
        target=lambda: leases.append(store.open_published(shard)), name="reader"
    )
    reader.start()
    assert opened.wait(30)
    evictor = threading.Thread(target=evict, name="evictor")
    evictor.start()
    assert decided.wait(30)
    go.set()
    reader.join()
    evictor.join()
    monkeypatch.undo()
    (lease,) = leases
    assert lease is not None
    assert os.fstat(lease).st_nlink == 1  # the reader holds the shard, not a removed file
    assert os.stat(store.path(shard)).st_ino == inode
    assert reserved == [None]  # no room: the only shard that could go is being read
    os.close(lease)
    assert reserve(store, put_key(2, 200))  # read: now it can go


def fds_on(inode: int) -> list[str]:
    """This process's fds open on ``inode``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/self/fd/{fd}").st_ino == inode:
                found.append(fd)
    return found


def test_a_download_closes_its_temp_file_before_publishing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # else an eviction right after the publish would unlink bytes the download still holds
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    key = CacheKey.of("sha256:" + hashlib.sha256(DATA[:100]).hexdigest(), 100)
    download = store.try_download_lock(key)
    assert download is not None
    held: list[list[str]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if src == store.part_path(key):
            held.append(fds_on(os.stat(src).st_ino))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    fill = Fill(key, "mem://shard")
    chunks = [DATA[:60], DATA[60:100]]
    run_fill(
        fill,
        store=store,
        stream=lambda: iter(chunks),
        lock_fd=download,
        counters=Counters(),
        raise_cache_errors=True,
    )
    monkeypatch.undo()
    assert fill.error is None and not fill.bypass
    assert held == [[]]  # published once, with no fd of its download open on it
    assert Path(store.path(key)).read_bytes() == DATA[:100]
    assert reserve(store, put_key(2, 200))  # evicted at once: nobody holds it
    assert not os.path.exists(store.path(key))


def test_a_reservation_never_counts_a_shard_being_published_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A publish (a rename from tmp/ to data/) between the reservation's look at tmp/ and
    # its look at data/ would count that shard twice: it would evict a shard, or find no
    # room, for room that is there.
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    done = put_key(1, 100)
    download = store.try_download_lock(done)
    fd = store.reserve(done)
    assert download is not None and fd is not None
    os.write(fd, bytes(100))
    os.close(fd)  # verified: about to be published
    decided = threading.Event()
    real_shards = store.shards

    def publish() -> None:
        try:
            store.publish(done)
        finally:
            decided.set()  # or it did not wait

    publisher = threading.Thread(target=publish, name="publisher")

    def shards() -> Iterator[CachedShard]:  # tmp/ has been read, data/ is next
        if not publisher.is_alive() and not decided.is_set():
            publisher.start()
            assert decided.wait(30)
        return real_shards()

    monkeypatch.setattr(store_module, "locked", telling_waits("publisher", decided))
    monkeypatch.setattr(store, "shards", shards)
    other = store.reserve(put_key(2, 150))
    publisher.join()
    monkeypatch.undo()
    assert other is not None and os.path.exists(store.path(done))  # 100 + 150 fit
    os.close(other)
    assert store.usage() == 250
    unlock(download)


def test_a_given_up_temp_file_stays_counted_while_it_is_read(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    key = put_key(1, 100)
    download = store.try_download_lock(key)
    fd = store.reserve(key)
    assert download is not None and fd is not None
    os.write(fd, bytes(60))
    os.close(fd)
    along = store.lease(store.part_path(key))  # a reader reading along
    assert along is not None
    store.mark_failed(key, os.fstat(along).st_ino, "sha256:" + "0" * 64)
    assert not os.path.exists(store.part_path(key))  # the name is free for another try
    assert store.failed_inode(key) == (os.fstat(along).st_ino, "sha256:" + "0" * 64)
    assert store.usage() == 100  # the bytes are still on disk: still counted
    assert not reserve(store, put_key(2, 200))
    store.sweep()
    assert [(p.size, p.retired) for p in store.parts()] == [(100, True)]
    assert store.stat().dead_temp_files == 1
    again = store.reserve(key)  # the next try of the same shard fits beside it
    assert again is not None
    os.close(along)  # the reader lets go
    store.sweep()
    assert [(p.size, p.retired) for p in store.parts()] == [(100, False)]  # the new try
    os.close(again)
    store.discard(key)
    assert list(store.parts()) == [] and store.usage() == 0
    unlock(download)


def test_clean_keeps_leased_shards(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path))
    store.ensure()
    keys = [put(store, i, 10, 100.0 + i) for i in range(4)]
    lease = store.open_published(keys[0])
    assert store.clean(keep=0) == (3, 30)
    assert [s.size for s in store.shards()] == [10]
    assert lease is not None
    os.close(lease)


def test_locks_conflict_across_fds_and_slots_cap(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    fd = try_lock(path)
    assert fd is not None and try_lock(path) is None and is_locked(path)
    unlock(fd)
    assert not is_locked(path)
    slots = NodeSlots(str(tmp_path / "slots"), 1)
    with slots.slot():
        assert try_lock(str(tmp_path / "slots" / "slot-000.lock")) is None
    again = try_lock(str(tmp_path / "slots" / "slot-000.lock"))
    assert again is not None
    unlock(again)
