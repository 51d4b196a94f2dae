"""Waits in the node cache end when what they wait for ends: a piece's claim let go (its
holder done or dead), a request slot freed, or the deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, opener_for
from shardkit.cache.layout import FillPieces
from shardkit.cache.locks import NodeSlots, claim_byte, try_lock, unlock, wait_claim
from shardkit.errors import CacheError
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

_HOLDER = """
import os, sys, time
from shardkit.cache.locks import claim_byte
fd = os.open(sys.argv[1], os.O_RDWR)
assert claim_byte(fd, int(sys.argv[2])) is not None
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([10] * 2, tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shards.base)) as srv:
        yield srv


def _part(cache: Path, shards: Manifest) -> tuple[int, int, str]:
    """A fill's temp file of shard 0, made as a fill makes it: fd, the map byte of piece 0
    and its path."""
    e = shards.shards[0]
    store = CacheStore(str(cache))
    key, layout = CacheKey.of(e.checksum, e.size), FillPieces.of(e.size, e.pieces)
    fd, published = store.open_part(key, layout)
    assert fd is not None and not published
    return fd, e.size, store.part_path(key, layout)


def _holder(path: str, offset: int) -> subprocess.Popen[str]:
    """Another process that claims byte ``offset`` of ``path`` and never lets go."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path, str(offset)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def test_a_wait_on_a_claim_ends_when_its_holder_dies(shards: Manifest, tmp_path: Path) -> None:
    fd, at, path = _part(tmp_path / "cache", shards)
    holder = _holder(path, at)
    try:
        assert not wait_claim(fd, at, 0.2)  # the deadline passes: the holder lives
        assert claim_byte(fd, at) is None
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(wait_claim(fd, at, 120)))
        waiter.start()
        holder.send_signal(signal.SIGKILL)
        waiter.join(60)
        assert woke == [True]
        # its claim died with it; the read lock the timed-out wait above left pending is
        # granted now too and let go at once (the cache's readers retry a lost claim)
        deadline = time.monotonic() + 30
        while (mine := claim_byte(fd, at)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mine is not None
        unlock(mine)
    finally:
        _end(holder)
        os.close(fd)


def test_a_wait_on_a_claim_of_this_process_ends_when_it_is_let_go(
    shards: Manifest, tmp_path: Path
) -> None:
    fd, at, _ = _part(tmp_path / "cache", shards)
    claim = claim_byte(fd, at)
    assert claim is not None
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(wait_claim(fd, at, 120)))
    waiter.start()
    unlock(claim)  # a fill thread of this process done with the piece
    waiter.join(60)
    assert woke == [True]
    os.close(fd)


@contextlib.contextmanager
def _held_reader(
    shards: Manifest, server: RangeServer, cache: Path, cache_wait: float
) -> Iterator[tuple[subprocess.Popen[str], Callable[[], BinaryIO], str]]:
    """Piece 0 of shard 0 claimed by another process; (that process, a function opening
    the shard through a caching opener, the shard's server path)."""
    fd, at, path = _part(cache, shards)
    holder = _holder(path, at)
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache, cache_wait=cache_wait)))
    m = load_manifest(server.url("manifest.json"), opener)
    e = m.shards[0]
    url = m.resolve(e.url)
    try:
        yield (
            holder,
            lambda: opener.open(ObjectRef(url, e.size, e.checksum, e.pieces)),
            ("/" + e.url),
        )
    finally:
        _end(holder)
        os.close(fd)


def test_a_reader_waiting_on_a_dead_holders_piece_fetches_it_itself(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    got: list[bytes] = []
    errors: list[BaseException] = []
    with _held_reader(shards, server, tmp_path / "cache", 120) as (holder, open_shard, path):

        def read() -> None:
            try:
                with open_shard() as f:
                    got.append(f.read())
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert server.requests(path) == []  # it waits: the piece is another's
        holder.send_signal(signal.SIGKILL)
        reader.join(60)
    assert errors == []
    assert got == [(Path(str(shards.base)) / path.lstrip("/")).read_bytes()]
    assert len(server.requests(path)) >= 1


def test_a_reader_waits_for_a_live_holder_only_until_cache_wait(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    with _held_reader(shards, server, tmp_path / "cache", 0.3) as (_, open_shard, path):
        with (
            pytest.raises(CacheError, match=r"waited \d+ s for piece 0 .*cache_wait=0.3"),
            open_shard() as f,
        ):
            f.read()
        assert server.requests(path) == []  # nothing fetched while the holder lives


def test_a_waiting_request_takes_the_first_slot_that_frees(tmp_path: Path) -> None:
    slots = NodeSlots(str(tmp_path / "slots"), 2)
    os.makedirs(slots.directory)
    first, second = (try_lock(str(tmp_path / "slots" / f"slot-00{i}.lock")) for i in range(2))
    assert first is not None and second is not None
    entered = threading.Event()

    def request() -> None:
        with slots.slot():
            entered.set()

    t = threading.Thread(target=request)
    t.start()
    unlock(second)  # not the first: a waiter must not sit on one busy slot
    assert entered.wait(60)
    t.join(60)
    unlock(first)


def test_the_background_leaves_the_reserved_slots_to_readers(tmp_path: Path) -> None:
    slots = NodeSlots(str(tmp_path / "slots"), 3, reserve=1)
    reserved = str(tmp_path / "slots" / "slot-002.lock")
    with slots.slot(), slots.slot():  # the background's two slots: never the reserved one
        free = try_lock(reserved)
        assert free is not None
        unlock(free)
        with slots.slot(urgent=True):  # a reader's request: the reserved slot, at once
            assert try_lock(reserved) is None
