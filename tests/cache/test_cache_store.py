"""io and cache pieces with real threads, locks and files: retry policy, resume loop,
config, keys, store, locks (integration: threads and filesystem semantics, not pure logic)."""

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

from shardkit._types import ObjectRef
from shardkit.cache import upkeep
from shardkit.cache.fill import ShardFill
from shardkit.cache.layout import CacheKey, FillPieces
from shardkit.cache.locks import (
    NodeSlots,
    claim_byte,
    is_locked,
    locked,
    try_lock,
    try_lock_existing,
    unlock,
)
from shardkit.cache.store import CacheStore
from shardkit.counters import Counters
from shardkit.errors import CacheError, ChecksumError, ConfigError, FetchError
from shardkit.format.pieces import PieceHasher, Pieces, piece_digest
from shardkit.io.clocked import resuming_chunks
from shardkit.io.config import CacheConfig, IoConfig
from shardkit.io.remote import ChunkStream
from shardkit.io.retry import Retryable, RetryPolicy, parse_retry_after
from shardkit.io.verified import PieceCheck

pytestmark = pytest.mark.integration

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


class RangedSource(FakeSource):
    """Answers at most 2000 bytes per request, as a server asked for ranges does."""

    def __call__(self, pos: int, end: int | None) -> FakeBody:
        body = super().__call__(pos, end)
        body.end = min(body.end, pos + 2000)
        return body


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


def test_only_a_whole_answer_resets_the_attempt_count() -> None:
    # answers of at most 2000 bytes (ranged requests): two drops, a whole answer, ...
    src = RangedSource([500, 500, None] * 10)
    data, sleeps, stats = run(src, attempts=3)
    assert data == DATA and stats["retries"] == len(sleeps) > 3  # never 3 in a row
    # every answer delivers some bytes, then breaks: that never ends, so it runs out
    src = FakeSource([1000] * 20)
    with pytest.raises(FetchError) as info:
        run(src, attempts=3)
    assert info.value.attempts == 3 and len(src.calls) == 3


def test_a_wait_past_the_deadline_is_not_begun() -> None:
    src = FakeSource([Retryable("HTTP 429", status=429, retry_after=3600.0), None])
    sleeps: list[float] = []
    policy = RetryPolicy(deadline=5.0)
    with pytest.raises(FetchError) as info:
        b"".join(resuming_chunks("mem://x", src, 0, None, policy=policy,
                                 counters=Counters(), sleep=sleeps.append))  # fmt: skip
    assert sleeps == [] and info.value.attempts == 1 and info.value.status == 429
    assert "deadline is 5 s" in str(info.value) and "mem://x" in str(info.value)


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
    cache = CacheConfig(cache_dir="/nvme/c", cache_limit=10**9)
    cfg = IoConfig(cache=cache, range_size=8 << 20, read_timeout=5)
    assert cfg.cache.cache_limit == 10**9 and cfg.range_size == 8 << 20 and cfg.read_timeout == 5
    with pytest.raises(ConfigError, match="no option rnage_size"):
        IoConfig(rnage_size=1)
    with pytest.raises(ConfigError, match="read_timeout"):
        IoConfig(read_timeout=0)
    with pytest.raises(ConfigError, match="on_cache_error"):
        IoConfig(cache=CacheConfig(on_cache_error="ignore"))


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


def open_part(store: CacheStore, key: CacheKey) -> int | None:
    """A new temp file for ``key`` (one piece: its map is 1 byte), or None: no room."""
    fd, published = store.open_part(key, FillPieces(key.size))
    assert not published
    return fd


def reserve(store: CacheStore, key: CacheKey) -> bool:
    fd = open_part(store, key)
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
    assert reserve(store, put_key(3, size=99))  # and its piece map: 100 bytes
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


def test_dead_parts_are_kept_and_evicted_like_shards_live_ones_counted(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path), limit=1000)
    store.ensure()
    dead, live, mine = put_key(1, 399), put_key(2, 399), put_key(3, 499)
    for key in (dead, live):
        fd = open_part(store, key)
        assert fd is not None
        os.close(fd)  # its fill died: the file stays, resumable
    held = store.lease(store.part_path(live))  # a fill or reader holds this one
    assert held is not None
    assert store.usage() == 800 and upkeep.stat(store).dead_temp_files == 1
    fd = open_part(store, mine)  # 400 (live) + 500 fits once the dead 400 is evicted
    assert fd is not None
    assert not os.path.exists(store.part_path(dead))
    assert os.path.exists(store.part_path(live)) and os.path.exists(store.part_path(mine))
    assert not reserve(store, put_key(4, 199))  # 400 + 500 held
    os.close(held)  # its fill died: now it can go
    assert reserve(store, put_key(4, 199))
    assert not os.path.exists(store.part_path(live))
    os.close(fd)


def telling_waits(name: str, waits: threading.Event) -> Callable[..., Any]:
    """A lock for the store's seam that sets ``waits`` when thread ``name`` has to wait."""
    real = locked

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


class Behind:
    """Thread ``name`` runs ``action`` while another operation is stopped half-way;
    :meth:`run` returns once it waits on the eviction lock (``lock`` is the store's seam
    that tells) or is done."""

    def __init__(self, name: str, action: Callable[[], object]) -> None:
        self.decided = threading.Event()
        self.lock = telling_waits(name, self.decided)
        self.out: list[object] = []
        self._action = action
        self.thread = threading.Thread(target=self._run, name=name)

    def _run(self) -> None:
        try:
            self.out.append(self._action())
        finally:
            self.decided.set()  # or it did not wait

    def run(self) -> None:
        self.thread.start()
        assert self.decided.wait(30)


def test_an_eviction_never_falls_between_opening_a_shard_and_leasing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader stopped after its open and before its lock, and an eviction that wants the
    # shard: evicting it then would unlink bytes the reader keeps on disk, uncounted.
    evictor = Behind("evictor", lambda: open_part(store, put_key(2, 199)))  # fits only without
    store = CacheStore(str(tmp_path), limit=250, lock=evictor.lock)  # the shard
    store.ensure()
    shard = put(store, 1, 100, 1000.0)
    inode = os.stat(store.path(shard)).st_ino
    opened, go = threading.Event(), threading.Event()
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if threading.current_thread().name == "reader" and os.fstat(fd).st_ino == inode:
            opened.set()
            assert go.wait(30)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    leases: list[int | None] = []
    reader = threading.Thread(
        target=lambda: leases.append(store.open_published(shard)), name="reader"
    )
    reader.start()
    assert opened.wait(30)
    evictor.run()
    go.set()
    reader.join()
    evictor.thread.join()
    monkeypatch.undo()
    (lease,) = leases
    assert lease is not None
    assert os.fstat(lease).st_nlink == 1  # the reader holds the shard, not a removed file
    assert os.stat(store.path(shard)).st_ino == inode
    assert evictor.out == [None]  # no room: the only shard that could go is being read
    os.close(lease)
    assert reserve(store, put_key(2, 199))  # read: now it can go


def fds_on(inode: int) -> list[str]:
    """This process's fds open on ``inode``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/self/fd/{fd}").st_ino == inode:
                found.append(fd)
    return found


class MemoryHost:
    """An in-memory remote for a fill: serves DATA, corrupting the next ``bad`` bodies
    that start at ``at``."""

    def __init__(
        self, store: CacheStore, bad: int = 0, at: int = 0, piece_parallel: int = 4
    ) -> None:
        self.store = store
        self.counters = Counters()
        self.cfg = IoConfig(cache=CacheConfig(piece_parallel=piece_parallel))
        self.bad = bad
        self.at = at
        self.asked: list[tuple[int, int]] = []

    def fetch(self, url: str, start: int, end: int, *, urgent: bool = False) -> Iterator[bytes]:
        self.asked.append((start, end))
        data = bytearray(DATA[start:end])
        if self.bad and start == self.at:
            self.bad -= 1
            data[0] ^= 1
        return iter([bytes(data[: len(data) // 2]), bytes(data[len(data) // 2 :])])


def pieces_of(size: int, piece: int) -> FillPieces:
    h = PieceHasher(piece)
    h.update(DATA[:size])
    return FillPieces(size, piece, h.result().digests)


def data_key(size: int) -> CacheKey:
    """The cache key of ``DATA[:size]``."""
    return CacheKey.of("sha256:" + hashlib.sha256(DATA[:size]).hexdigest(), size)


def open_data_part(store: CacheStore, key: CacheKey, layout: FillPieces) -> int:
    """A fill's temp file of ``key``, opened as a fill opens it (not yet published)."""
    fd, _ = store.open_part(key, layout)
    assert fd is not None
    return fd


def new_fill(host: Any, key: CacheKey, url: str, layout: FillPieces, fd: int) -> ShardFill:
    """A fill of ``key`` (by ``layout``'s pieces) at ``url``, on the temp file ``fd``."""
    pieces = Pieces(layout.piece_size, layout.digests) if layout.digests else None
    return ShardFill(host, ObjectRef(url, key.size, key.checksum, pieces), fd)


def fill_all(fill: ShardFill) -> None:
    fill.start(0)
    assert fill.done.wait(30)


def test_a_fill_publishes_with_no_lease_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # else an eviction right after the publish could not take a shard nobody reads
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    key = data_key(100)
    layout = pieces_of(100, 30)
    unleased: list[bool] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if src == store.part_path(key, layout):
            fd = try_lock_existing(src)
            unleased.append(fd is not None)
            if fd is not None:
                os.close(fd)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    fd = open_data_part(store, key, layout)
    host = MemoryHost(store, piece_parallel=2)
    fill = new_fill(host, key, "mem://shard", layout, os.dup(fd))
    os.close(fd)
    fill_all(fill)
    monkeypatch.undo()
    assert fill.error is None and unleased == [True]
    assert Path(store.path(key)).read_bytes() == DATA[:100]
    asked = sorted(host.asked)  # each piece once, runs of pieces of at most half the shard
    assert [lo for lo, _ in asked] == sorted({0, *(hi for _, hi in asked[:-1])})
    assert asked[-1][1] == 100 and all(hi - lo <= 50 and lo % 30 == 0 for lo, hi in asked)
    assert host.counters.snapshot()["pieces_fetched"] == 4
    assert reserve(store, put_key(2, 199))  # evicted at once: nobody holds it
    assert not os.path.exists(store.path(key))


def test_a_piece_is_verified_before_its_map_says_so_and_resumed(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path))
    key = data_key(1000)
    layout = pieces_of(1000, 256)
    fd = open_data_part(store, key, layout)
    host = MemoryHost(store, bad=1, at=512)
    fill = new_fill(host, key, "mem://shard", layout, os.dup(fd))
    fill.need(fd, 2)  # a reader mid-shard: its piece at once; corrupt once, fetched again
    assert host.asked.count((512, 768)) == 2
    assert os.pread(fd, 256, 512) == DATA[512:768] and fill.ready(fd, 2)
    assert host.counters.snapshot()["checksum_failures"] == 1
    assert fill.done.wait(30) and os.path.exists(store.path(key))
    os.close(fd)
    # a temp file left by a dead fill: its verified pieces are kept, the others fetched
    key2 = data_key(900)
    layout2 = pieces_of(900, 256)
    fd = open_data_part(store, key2, layout2)
    os.pwrite(fd, DATA[256:512], 256)
    os.pwrite(fd, b"\1", 900 + 1)  # piece 1 verified, then the fill died
    os.close(fd)
    fd = open_data_part(store, key2, layout2)
    host2 = MemoryHost(store)
    fill_all(new_fill(host2, key2, "mem://shard", layout2, os.dup(fd)))
    os.close(fd)
    assert sorted(host2.asked) == [(0, 256), (512, 768), (768, 900)]
    assert Path(store.path(key2)).read_bytes() == DATA[:900]


def test_the_piece_a_reader_waits_for_comes_over_several_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardkit.cache.download as download_module

    monkeypatch.setattr(download_module, "_MIN_SPLIT", 100)
    store = CacheStore(str(tmp_path))
    key = data_key(2000)
    layout = pieces_of(2000, 1000)
    fd = open_data_part(store, key, layout)
    host = MemoryHost(store, bad=1, at=1000, piece_parallel=4)
    fill = new_fill(host, key, "mem://shard", layout, os.dup(fd))
    fill.need(fd, 1)  # 4 ranges at once; one came corrupt: the piece is fetched again
    mine = sorted(a for a in host.asked if a[0] >= 1000)
    assert mine == sorted([(1000, 1250), (1250, 1500), (1500, 1750), (1750, 2000)] * 2)
    assert os.pread(fd, 1000, 1000) == DATA[1000:2000] and fill.ready(fd, 1)
    assert fill.done.wait(30)
    os.close(fd)
    assert Path(store.path(key)).read_bytes() == DATA[:2000]


def test_a_piece_corrupt_twice_is_named_and_never_marked(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path))
    key = data_key(1000)
    layout = pieces_of(1000, 256)
    fd = open_data_part(store, key, layout)
    host = MemoryHost(store, bad=2, at=256, piece_parallel=1)
    fill = new_fill(host, key, "mem://s", layout, os.dup(fd))
    with pytest.raises(ChecksumError, match=r"piece 1 \(bytes 256\.\.512\)") as info:
        fill.need(fd, 1)
    assert info.value.url == "mem://s" and info.value.expected == f"xxh3_128:{layout.digests[1]}"  # type: ignore[index]
    assert not fill.ready(fd, 1) and fill.done.wait(30)
    with pytest.raises(ChecksumError):  # this fill is over: a later open tries again
        fill.need(fd, 1)
    os.close(fd)
    assert not os.path.exists(store.path(key))


def test_claims_conflict_across_descriptions_and_die_with_them(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(10))
    fd = os.open(path, os.O_RDWR)
    a = claim_byte(fd, 3)
    assert a is not None
    assert claim_byte(fd, 3) is None  # even in this process, on another description
    b = claim_byte(fd, 4)
    assert b is not None
    unlock(a)
    c = claim_byte(fd, 3)
    assert c is not None
    for x in (b, c):
        unlock(x)
    os.close(fd)


def test_piece_hasher_splits_at_piece_boundaries() -> None:
    h = PieceHasher(1000)
    for i in range(0, len(DATA), 333):
        h.update(DATA[i : i + 333])
    got = h.result()
    assert got.digests == tuple(piece_digest(DATA[i : i + 1000]) for i in range(0, 10_000, 1000))
    whole = PieceCheck(ObjectRef("x", 10, data_key(10).checksum))
    assert got.span(9, len(DATA)) == (9000, 10_000) and whole.span(0) == (0, 10)


def test_a_reservation_never_counts_a_shard_being_published_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A publish (a rename from tmp/ to data/ and its ledger line) between the reservation's
    # look at tmp/ and its look at the ledger would count that shard twice: it would evict
    # a shard, or find no room, for room that is there. It waits for the reservation.
    publisher = Behind("publisher", lambda: store.publish(done, FillPieces(99)))
    store = CacheStore(str(tmp_path), limit=250, lock=publisher.lock)
    store.ensure()
    done = put_key(1, 99)
    fd = open_part(store, done)
    assert fd is not None
    os.pwrite(fd, bytes(99), 0)
    os.ftruncate(fd, 99)
    os.close(fd)  # verified and cut: about to be published
    real_sweep = store._sweep

    def sweep() -> int:  # tmp/ is read next, then the ledger
        if not publisher.thread.is_alive() and not publisher.decided.is_set():
            publisher.run()
        return real_sweep()

    monkeypatch.setattr(store, "_sweep", sweep)
    other = open_part(store, put_key(2, 149))
    publisher.thread.join()
    monkeypatch.undo()
    assert publisher.out == [True]
    assert other is not None and os.path.exists(store.path(done))  # 100 + 150 fit
    os.close(other)
    assert store.usage() == 99 + 150  # published: its piece map is gone


def test_a_given_up_temp_file_stays_counted_while_it_is_read(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path), limit=250)
    store.ensure()
    key = put_key(1, 99)
    fd = open_part(store, key)
    assert fd is not None
    os.close(fd)
    along = store.lease(store.part_path(key))  # a reader
    assert along is not None
    store.discard(key, FillPieces(99))
    assert not os.path.exists(store.part_path(key))  # the name is free for another try
    assert store.usage() == 100  # the bytes are still on disk: still counted
    assert not reserve(store, put_key(2, 199))
    store.sweep()
    assert [(p.size, p.retired) for p in store.parts()] == [(100, True)]
    assert upkeep.stat(store).dead_temp_files == 1
    again = open_part(store, key)  # the next try of the same shard fits beside it
    assert again is not None
    store.let_go(along, key, FillPieces(99))  # the reader lets go: the given-up file goes
    assert [(p.size, p.retired) for p in store.parts()] == [(100, False)]  # the new try
    os.close(again)
    store.discard(key, FillPieces(99))
    assert list(store.parts()) == [] and store.usage() == 0


def test_clean_keeps_leased_shards(tmp_path: Path) -> None:
    store = CacheStore(str(tmp_path))
    store.ensure()
    keys = [put(store, i, 10, 100.0 + i) for i in range(4)]
    lease = store.open_published(keys[0])
    assert upkeep.clean(store, keep=0) == (3, 30)
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


def test_a_cache_being_set_up_by_another_process_is_taken_as_ours(tmp_path: Path) -> None:
    # another process wrote its tag and a ledger temp file between this one's tag check and
    # its listing: the folder holds only the cache's own names, so it is a cache, not foreign
    root = tmp_path / "cache"
    root.mkdir()
    (root / "ledger.tmp-12345").write_bytes(b"")
    (root / "locks").mkdir()
    store = CacheStore(str(root), limit=1 << 20)
    store.ensure()
    assert (root / "CACHEDIR.TAG").exists()
    (root / "notes.txt").write_text("mine")
    (root / "CACHEDIR.TAG").unlink()
    with pytest.raises(CacheError, match=r"notes\.txt"):
        CacheStore(str(root), limit=1 << 20).ensure()


def test_a_file_named_like_a_cache_folder_is_still_foreign(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("the user's own table")
    with pytest.raises(CacheError, match=r"data\.csv"):
        CacheStore(str(tmp_path), limit=1 << 20).ensure()
    assert (tmp_path / "data.csv").read_text() == "the user's own table"
