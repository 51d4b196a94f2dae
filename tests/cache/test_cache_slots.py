"""Issue 19 finding 6: the node's request slots never hang a reader. A process stopped
(SIGSTOP: a debugger, a Slurm suspend) while it holds a slot is taken over after a lease;
every wait for a slot is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit.cache.locks import NodeSlots
from shardkit.errors import CacheError
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import CacheConfig, IoConfig
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

_HOLDER = """
import sys
from shardkit._types import ObjectRef
from shardkit.cache import opener_for
from shardkit.io import CacheConfig, IoConfig, load_manifest
cache = CacheConfig(cache_dir=sys.argv[2], node_requests=1, piece_parallel=1)
opener = opener_for(IoConfig(cache=cache))
m = load_manifest(sys.argv[1], opener)
e = m.shards[0]
with opener.open(ObjectRef(m.resolve(e.url), e.size, e.checksum, e.pieces)) as f:
    f.read()
"""


@pytest.mark.timeout(90)
def test_a_stopped_process_holding_the_only_slot_is_taken_over(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    from shardkit.streaming.dataset import ShardDataset
    from shardkit.streaming.loader import WebLoader

    other = make_shards([10], tokens=3000, subdir="other", seed=1)  # other bytes
    mine = make_shards([10, 10], tokens=3000, subdir="mine")
    cache = str(tmp_path / "cache")
    with (
        RangeServer(str(other.base)) as slow,
        RangeServer(str(mine.base)) as fast,
    ):
        path = "/" + other.shards[0].url
        slow.add_fault(path, "stall", after=1000, seconds=60)  # a request that holds on
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, slow.url("manifest.json"), cache], cwd=ROOT
        )
        try:
            slow.wait_body(path, 1000)  # its request holds the slot
            holder.send_signal(signal.SIGSTOP)
            io = IoConfig(
                read_timeout=1.0,
                cache=CacheConfig(cache_dir=cache, node_requests=1, cache_wait=30.0),
            )
            ds = ShardDataset(fast.url("manifest.json"), shardshuffle=False, io=io)
            began = time.monotonic()
            got = sorted(s["__key__"] for s in WebLoader(ds, num_workers=2))
            took = time.monotonic() - began
        finally:
            holder.kill()
            holder.wait(30)
    assert got == sorted(str(s["__key__"]) for s in read_samples(mine))
    assert took < 20  # the lease (2 x read_timeout) and the read, not cache_wait


def test_every_wait_for_a_slot_is_bounded(tmp_path: Path) -> None:
    slots = NodeSlots(str(tmp_path / "slots"), 1, wait=0.5, lease=60)
    with slots.slot():  # held, and fresh: nobody may take it over
        began = time.monotonic()
        with (
            pytest.raises(CacheError, match=r"waited 0.5 s for one of the node's 1 request"),
            slots.slot(),
        ):
            pass
        assert time.monotonic() - began < 5
    stale = NodeSlots(str(tmp_path / "slots"), 1, wait=30, lease=0.2)
    with slots.slot():
        slot = tmp_path / "slots" / "slot-000.lock"
        old = slot.stat().st_ino
        with stale.slot():  # its holder has held it past the lease: taken over
            assert slot.stat().st_ino != old
    assert os.path.exists(slot)
