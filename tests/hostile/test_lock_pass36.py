"""Hostile pass on the writer lock held by the writer, not its thread (711492c, 32112e7):
object-store lock objects (moto on 127.0.0.1) taken over from a writer
dropped unclosed, inherited by a forked child. Each test failed on the code before its fix."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.errors import ConfigError, WriterError
from shardkit.write.writer import object_lock
from tests.helpers.servers import moto_process
from tests.helpers.stores import Store, moto_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3() -> Iterator[Store]:
    with moto_store() as s:
        yield s


def _sample(i: int) -> dict[str, object]:
    return {"__key__": f"k{i:03d}", "txt": f"sample {i}"}


def _locks(store: Store, prefix: str) -> list[str]:
    return [k for k in store.names() if k.startswith(prefix + "/.lock-")]


def _renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardkit-lock"]


@pytest.mark.timeout(30)
def test_a_renewal_in_flight_when_its_writer_is_dropped_leaves_no_lock_behind(
    s3: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped writer's heartbeat was only told to stop: a renewal already on its way (a
    slow store, a retry) put the lock object back after the writer that took it over had
    closed and deleted it, so the prefix stayed locked by this very process ('another build
    writes here (pid <ours>)') for the lease. Taking over now waits for that renewal to end."""
    monkeypatch.setattr(object_lock, "RENEW", 0.05)
    url = s3.url("inflight/")
    entered, go = threading.Event(), threading.Event()

    def write_and_drop() -> None:
        w = sk.ShardWriter(url)
        w.write(_sample(0))
        store: Any = w.output.store  # type: ignore[attr-defined]
        real = store.put

        def slow_put(key: str, data: bytes) -> str:  # the store answers this one late
            entered.set()
            go.wait(3)
            return str(real(key, data))

        store.put = slow_put
        assert entered.wait(3)  # the heartbeat is inside a renewal now
        raise RuntimeError("a bug mid-write")

    with pytest.raises(RuntimeError):
        write_and_drop()
    gc.collect()
    timer = threading.Timer(1.0, go.set)  # the slow answer comes in the end
    timer.start()
    try:
        with sk.ShardWriter(url, resume=True) as again:
            again.write(_sample(1))
        go.set()  # (before the fix the taker had closed by now: the late put lands after)
        for t in _renewers():
            t.join(timeout=5)
    finally:
        go.set()
        timer.cancel()
    assert not _locks(s3, "inflight")
    sk.ShardWriter(url, resume=True).close()  # not refused by a lock of our own
    assert not _locks(s3, "inflight")


@pytest.mark.timeout(30)
def test_a_forked_child_is_refused_by_its_parents_lock_as_another_process(s3: Store) -> None:
    """A child forked while its parent held a writer open inherited the registry of this
    process's lock objects: it was refused as 'a ShardWriter this thread holds open: close
    it first', the parent's writer, which the child must not close (that deletes the
    parent's lock objects and writes a manifest over its shards). As a folder's lock, the
    object lock is not inherited: the child is refused by the parent's lock objects, named."""
    url = s3.url("forked/")
    with sk.ShardWriter(url) as w:
        w.write(_sample(0))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                sk.ShardWriter(url).close()
                said = "let in"
            except WriterError as exc:
                said = str(exc)
            except BaseException as exc:  # noqa: BLE001 - reported, the child ends at once
                said = repr(exc)
            os.write(write, said.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            said = f.read().decode()
        os.waitpid(pid, 0)
        assert f"pid {os.getpid()} on host" in said, said
        w.write(_sample(1))
    assert not _locks(s3, "forked")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_next_writer_of_a_folder_removes_the_shard_a_dropped_writer_left_half_written(
    tmp_path: Path,
) -> None:
    """A writer dropped unclosed (a raise mid-write) left its open shard's temp file; the
    next writer of this process, let in at once, kept it (a temp file of a pid that runs was
    taken for a live writer's), so each retry in a notebook left up to a shard's size of
    hidden bytes for the life of the process. Under the prefix's lock no live writer of this
    process writes there: the next writer removes them."""
    out = tmp_path / "out"

    def write_and_fail() -> None:
        w = sk.ShardWriter(str(out), maxcount=2)
        for i in range(3):  # one shard whole, the next one open
            w.write(_sample(i))
        raise RuntimeError("a bug mid-write")

    with pytest.raises(RuntimeError):
        write_and_fail()
    gc.collect()
    assert [p.name for p in out.glob(".data-*.tmp-*")]  # the open shard's bytes
    with sk.ShardWriter(str(out), overwrite=True) as again:
        again.write(_sample(9))
    assert not [p.name for p in out.glob(".data-*.tmp-*")]
    assert sorted(p.name for p in out.glob("data-*")) == ["data-000000.tar"]


def test_a_manifest_named_by_a_path_is_refused_not_locked_beside_another_folders(
    s3: Store, tmp_path: Path
) -> None:
    """ShardWriter(s3://b/p, manifest='sub/manifest.json') locked '.lock-sub/manifest.json'
    under p and wrote p/sub/manifest.json, where a writer of s3://b/p/sub locks
    '.lock-manifest.json' under p/sub: both were let in and wrote one manifest. In a folder
    the same name was a bare FileNotFoundError. A manifest is a name, refused as a path."""
    for out in (s3.url("named/"), str(tmp_path / "out")):
        for name in ("sub/manifest.json", "../manifest.json", ".."):
            with pytest.raises(ConfigError, match="is a file name in the output, not a path"):
                sk.ShardWriter(out, manifest=name)
    assert not _locks(s3, "named")


def test_a_manifest_named_as_a_shard_is_refused_not_written_over_another_writers_shard(
    tmp_path: Path,
) -> None:
    """A lock covers a manifest's name and a shard prefix, not each shard's name: beside a
    writer of prefix 'data', a writer of prefix 'x' with manifest='data-000000.tar' was let
    in and its manifest replaced the other's first shard (verify: not a tar header). A
    manifest is a .json name."""
    with sk.ShardWriter(tmp_path, prefix="data") as w:
        w.write(_sample(0))
        for name in ("data-000000.tar", "data-000000.tar.zst", "data-000000.tar.gz"):
            with pytest.raises(ConfigError, match=r"name it \*\.json"):
                sk.ShardWriter(tmp_path, prefix="x", manifest=name)
        w.write(_sample(1))
    assert (tmp_path / "data-000000.tar").read_bytes()[257:262] == b"ustar"
    for name in ("m.csv", "m"):  # its own CSV went over it; a reader took 'm' for a shard
        with pytest.raises(ConfigError, match=r"name it \*\.json"):
            sk.ShardWriter(tmp_path / "other", manifest=name)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_writer_an_exception_still_holds_is_named_so_the_refusal_says_how_to_go_on(
    tmp_path: Path,
) -> None:
    """A writer that raised mid-write lives on in a traceback its caller keeps (a notebook
    keeps the last one): the next writer there was told 'close it first', of a writer the
    user has no name for. The refusal says what holds it."""

    def write_and_fail() -> None:
        w = sk.ShardWriter(tmp_path)
        w.write(_sample(0))
        raise RuntimeError("a bug mid-write")

    try:
        write_and_fail()
    except RuntimeError as exc:
        kept = exc  # what sys.last_value keeps in a notebook
    with pytest.raises(WriterError, match="let go of an exception raised while it wrote"):
        sk.ShardWriter(tmp_path)
    del kept
    gc.collect()
    sk.ShardWriter(tmp_path, resume=True).close()  # let go: the next writer goes on


def test_a_bucket_of_the_same_name_in_another_store_is_another_output(s3: Store) -> None:
    """The registry of this process's lock objects was keyed by url text, which names no
    endpoint: a writer into s3://b/p of another store (a mirror, another S3 service) was
    refused as 'a ShardWriter this thread holds open' by the writer of s3://b/p here."""
    import boto3

    with moto_process() as other:
        boto3.client("s3", endpoint_url=other).create_bucket(Bucket=s3.bucket)
        url = s3.url("mirror/")
        with sk.ShardWriter(url) as here, sk.ShardWriter(url, endpoint_url=other) as there:
            with pytest.raises(WriterError, match="holds open"):
                sk.ShardWriter(url)  # the same store is still one output
            here.write(_sample(0))
            there.write(_sample(1))
    assert not _locks(s3, "mirror")
