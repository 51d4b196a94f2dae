"""One writer per object-store prefix inside one process too: the lock is held by the
writer (or the build's target), not by its thread. A second writer or a build of a prefix a
ShardWriter holds open is refused from the same thread; a writer dropped unclosed (a raise
mid-write) stops renewing its lock objects, and the next writer of this process takes them
over at once. Real emulators on 127.0.0.1: moto and Azurite (the GCS emulator creates an
object whatever generation a put asks for, so a lock object there is never refused)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.errors import WriterError
from shardkit.io import load_manifest
from shardkit.write.writer.object_lock import LEASE
from tests.helpers.readback import keys_of, read_samples, write_jsonl
from tests.helpers.stores import Store, object_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["s3", "az"])
def clean(request: pytest.FixtureRequest) -> Iterator[Store]:
    """An emulated bucket; each test writes prefixes of its own."""
    with object_store(request.param) as s:
        yield s


def _sample(i: int) -> dict[str, object]:
    return {"__key__": f"k{i:03d}", "txt": f"sample {i}"}


def _keys(store: Store, prefix: str) -> list[str]:
    opener = make_opener()
    manifest = load_manifest(store.url(f"{prefix}/manifest.json"), opener)
    return keys_of(read_samples(manifest, opener))


def _locks(store: Store) -> list[str]:
    return [k for k in store.names() if ".lock-" in k]


def _renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardkit-lock"]


def test_a_writer_held_open_refuses_a_second_writer_and_a_build_from_its_thread(
    clean: Store, tmp_path: Path
) -> None:
    """The lock objects were re-entrant per thread: a second ShardWriter or a build of the
    prefix, run in the thread of an open writer (a notebook), went in and mixed shards and
    manifests with it."""
    url = clean.url("held/")
    src = write_jsonl(tmp_path / "in.jsonl", ({"x": i} for i in range(10)))
    with sk.ShardWriter(url, maxcount=2) as w:
        w.write(_sample(0))
        with pytest.raises(WriterError, match=r"held/? is being written by a ShardWriter this"):
            sk.ShardWriter(url, maxcount=2)
        with pytest.raises(WriterError, match="holds open: close it first"):
            sk.build([str(src)], url, progress=False)
        for i in range(1, 5):
            w.write(_sample(i))
    assert _keys(clean, "held") == [f"k{i:03d}" for i in range(5)]
    assert not _locks(clean)  # (a build's lock still lent to its own writer: test_build_objects)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_writer_dropped_unclosed_lets_the_next_writer_go_on_at_once(
    clean: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer lost to a raise mid-write left its lock objects renewed by a heartbeat that
    held on for the life of the process; now its heartbeat stops when it is collected and
    the retry in this thread takes its lock over at once, resumes and lets go at close."""
    url = clean.url("drop/")

    def write_and_fail() -> None:
        w = sk.ShardWriter(url, maxcount=2)
        for i in range(3):  # one shard whole, the next one open
            w.write(_sample(i))
        raise RuntimeError("a bug mid-write")

    with contextlib.suppress(RuntimeError):  # its traceback (the writer's frame) goes
        write_and_fail()
    gc.collect()
    for t in _renewers():
        t.join(timeout=2)
    assert not _renewers()  # the dropped writer's heartbeat stopped
    assert _locks(clean)  # no request was made at collection: its lock objects are there
    t0 = time.monotonic()
    with sk.ShardWriter(url, maxcount=2, resume=True) as again:
        assert again.resumed_samples == 2
        for i in range(2, 6):
            again.write(_sample(i))
    assert time.monotonic() - t0 < 5  # at once, not after a lease
    assert "taking over the stale lock of a writer of this process dropped" in caplog.text
    assert _keys(clean, "drop") == [f"k{i:03d}" for i in range(6)]
    assert not _locks(clean)


def test_a_lock_not_renewed_is_taken_over_though_its_process_runs_on_this_host(
    clean: Store,
) -> None:
    """A process of this host that dropped its writer unclosed renews its lock objects no
    more, but runs on: its lock was never stale on this host (its pid answers), so no build
    here could go on until that process ended. Not renewed for the lease, it is taken over,
    as a killed process's is; renewed, it holds."""
    now = time.time()
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "started": now - 2 * LEASE}
    clean.put("lease/.lock-manifest.json", json.dumps({**holder, "renewed": now}).encode())
    with pytest.raises(WriterError, match=f"pid {os.getppid()} on host"):
        sk.ShardWriter(clean.url("lease/"))
    assert json.loads(clean.get("lease/.lock-manifest.json"))["renewed"] == now
    gone = {**holder, "renewed": now - LEASE - 60}
    clean.put("lease/.lock-manifest.json", json.dumps(gone).encode())
    with sk.ShardWriter(clean.url("lease/")) as w:
        w.write(_sample(0))
    assert _keys(clean, "lease") == ["k000"] and not _locks(clean)
