"""Writers that write straight into object stores (s3://, gs://, az://), against real
emulators on 127.0.0.1 (moto's server, a GCS emulator, Azurite): shards streamed up as
they are written, nothing partial ever visible, the manifest last, resume from what is
verifiably there; a url a writer cannot serve is an error, never a local directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.cli import cli
from shardkit.errors import ConfigError, ManifestError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest
from shardkit.io.stores import open_store
from tests.helpers.readback import read_samples
from tests.helpers.stores import Store, object_store

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["s3", "gs", "az"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with object_store(request.param) as s:
        yield s


@pytest.fixture
def clean(store: Store) -> Iterator[Store]:
    yield store
    store.clear()


def samples(n: int, start: int = 0, size: int = 40_000) -> Iterator[dict[str, object]]:
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        tokens = rng.integers(0, 50_000, size=size // 4, dtype=np.int32)
        yield {"__key__": f"doc-{i:05d}", "tokens.npy": tokens, "json": {"i": i}}


def _remote(store: Store, prefix: str) -> Manifest:
    return load_manifest(store.url(f"{prefix}/manifest.json"), make_opener())


def test_writer_streams_shards_into_the_store(clean: Store, tmp_path: Path) -> None:
    store = clean
    with sk.ShardWriter(store.url("run/"), maxsize="300KB") as w:
        for s in samples(30):
            w.write(s)
    keys = store.names()
    assert "run/manifest.json" in keys and "run/manifest.csv" in keys
    m = _remote(store, "run")
    assert m.total_samples == 30 and len(m) >= 3
    assert all(f"run/{e.url}" in keys and f"run/{index_name(e.url)}" in keys for e in m.shards)
    assert not [k for k in keys if ".journal" in k]  # folded at close
    got = read_samples(m, make_opener())
    assert [s["__key__"] for s in got] == [f"doc-{i:05d}" for i in range(30)]
    # the same samples written locally give byte-identical shards
    with sk.ShardWriter(tmp_path / "local", maxsize="300KB") as w:
        for s in samples(30):
            w.write(s)
    local = Manifest.load(tmp_path / "local" / "manifest.json")
    assert [(e.url, e.checksum) for e in local.shards] == [(e.url, e.checksum) for e in m.shards]
    ds = sk.ShardDataset(store.url("run/manifest.json"), cache_dir=tmp_path / "cache")
    assert sorted(s["__key__"] for s in ds) == [f"doc-{i:05d}" for i in range(30)]
    res = CliRunner().invoke(cli, ["verify", store.url("run/manifest.json"), "--deep"])
    assert res.exit_code == 0, res.output


def test_a_shard_appears_only_whole(clean: Store) -> None:
    store = clean
    w = sk.ShardWriter(store.url("cut"), maxsize="2MB")
    for s in samples(20):  # about 800 KB: the first shard is still being written
        w.write(s)
    assert w._shard is not None
    assert not [k for k in store.names() if k.endswith(".tar")]
    w.abort()  # as a `with` block that raises
    assert not [k for k in store.names() if k.endswith(".tar")]


def test_an_upload_dropped_unfinished_leaves_nothing_even_after_collection(clean: Store) -> None:
    """An upload let go of without complete() or abort() (a writer dropped, a crash caught)
    never makes an object appear, also when the garbage collector finalizes it: the SDK's
    GCS writer completed the partial object from its finalizer, with requests at whatever
    point the collector ran (CI hung on the single-threaded emulator there)."""
    import gc

    store, prefix = open_store(clean.url("drop/"), part_size=5 << 20)
    up = store.upload(prefix + "data-000000.tar")
    up.write(b"x" * (6 << 20))  # one part sent, the rest held
    del up
    gc.collect()
    assert not [k for k in clean.names() if k.startswith("drop/")]
    again = store.upload(prefix + "data-000000.tar")
    again.write(b"y" * 1000)
    again.complete()
    assert clean.get("drop/data-000000.tar") == b"y" * 1000
    if clean.scheme == "s3":  # what the dropped one left is billed until aborted
        assert store.abort_stale(prefix, older_than=0) == 1


def test_resume_goes_on_from_what_is_there(clean: Store) -> None:
    store = clean
    w = sk.ShardWriter(store.url("res"), maxcount=4)
    for s in samples(10):
        w.write(s)
    w.next_shard()  # three shards whole, then the writer "dies": never closed
    del w
    journal = [k for k in store.names() if ".journal.d/" in k]
    assert len(journal) >= 1  # shards not yet folded into the manifest are journalled
    with sk.ShardWriter(store.url("res"), maxcount=4, resume=True) as again:
        assert again.resumed_samples == 10
        for s in samples(6, start=10):
            again.write(s)
    m = _remote(store, "res")
    got = [s["__key__"] for s in read_samples(m, make_opener())]
    assert got == [f"doc-{i:05d}" for i in range(16)]


def test_resume_refuses_a_shard_replaced_behind_its_back(clean: Store) -> None:
    store = clean
    w = sk.ShardWriter(store.url("swap"), maxcount=4)
    for s in samples(8):
        w.write(s)
    w.next_shard()
    del w
    data = bytearray(store.get("swap/data-000001.tar"))
    data[700] ^= 1
    store.put("swap/data-000001.tar", bytes(data))  # same size, other bytes
    with pytest.raises(ManifestError, match=r"data-000001\.tar was replaced"):
        sk.ShardWriter(store.url("swap"), maxcount=4, resume=True)


def test_overwrite_replaces_the_data_set_in_the_store(clean: Store) -> None:
    store = clean
    with sk.ShardWriter(store.url("ow/"), maxcount=3) as w:
        for s in samples(10):
            w.write(s)
    store.put("ow/other.txt", b"not ours")  # not the data set's: stays
    for stray in (index_name("data-000009.tar"), "data-000008.tar.idx"):  # unlisted: go
        store.put(f"ow/{stray}", b"an index of this prefix, in either layout")
    with sk.ShardWriter(store.url("ow/"), maxcount=5, overwrite=True) as w:
        for s in samples(5, start=50):
            w.write(s)
    m = _remote(store, "ow")
    assert [s["__key__"] for s in read_samples(m, make_opener())] == [
        f"doc-{i:05d}" for i in range(50, 55)
    ]
    names = ["data-000000.tar", index_name("data-000000.tar"), "manifest.json", "manifest.csv"]
    names += [".manifest.json.etags.json", "other.txt"]
    assert store.names() == sorted(f"ow/{n}" for n in names)


def test_stale_multipart_uploads_are_aborted(clean: Store) -> None:
    if clean.scheme != "s3":
        assert open_store(clean.url("p"))[0].abort_stale("p", older_than=0) == 0
        return
    client = clean.client
    client.create_multipart_upload(Bucket=clean.bucket, Key="p/data-000007.tar")
    store, _ = open_store(clean.url("p"))
    # younger than the grace time: kept (moto dates every upload 2010-11-10, so "young"
    # here is a grace time longer than that)
    assert store.abort_stale("p/", older_than=100 * 365 * 86400) == 0
    assert store.abort_stale("p/", older_than=0) == 1
    assert not client.list_multipart_uploads(Bucket=clean.bucket).get("Uploads")


@pytest.mark.parametrize("url", ["http://host/out/", "hf://datasets/x", "ftp://h/o"])
def test_a_url_a_writer_cannot_serve_is_an_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="s3://, gs:// or az://"):
        sk.ShardWriter(url)
    assert os.listdir(tmp_path) == []  # no local directory named after the scheme


@pytest.mark.parametrize("url", ["s3://bucket/p/", "gs://b/p", "az://c/p", "hf://datasets/x"])
def test_writers_that_write_locally_refuse_a_url_naming_the_way(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build -o, manifest merge -o, from-shards -o, Ray's sink and sk.build: never a local
    directory named 's3:' (the bug: exit 0 having written one). Object-store urls are served
    by build -o and by adoption of shards in the store (tests/cli/test_build_objects.py);
    what they cannot serve is refused, saying why."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("x")
    with sk.ShardWriter(tmp_path / "p0", part=(0, 1)) as w:
        w.write({"__key__": "a", "txt": "x"})
    runner = CliRunner()
    served = not url.startswith("hf://")
    # a merge into a bucket takes its parts from the bucket (test_parts_written_into...)
    checks = [(["manifest", "merge", "p0/manifest.json", "-o", url], "takes parts there too")]
    if served:  # from-shards does not upload local shards
        checks.append((["manifest", "from-shards", "in", "-o", url], "upload the shards first"))
    else:
        checks = [(argv, "writes to a local directory") for argv, _ in checks]
        checks.append((["build", "in", "-o", url], "writes to a local directory"))
        checks.append((["manifest", "from-shards", "in", "-o", url], "writes to a local directory"))
        with pytest.raises(ConfigError, match="writes to a local directory"):
            sk.build(["in"], url)
    for argv, why in checks:
        res = runner.invoke(cli, argv)
        said = res.output + str(res.exception or "")  # the group's caller prints errors
        assert res.exit_code != 0 and why in said, (argv, said)
    if url.startswith("hf://"):  # the Ray sink writes into s3/gs/az (test_ray_objects.py)
        from shardkit.ray import ShardDatasink

        with pytest.raises(ConfigError, match="writes to a local directory"):
            ShardDatasink(url)
    assert sorted(os.listdir(tmp_path)) == ["in", "p0"]


def test_parts_written_into_the_store_merge_there(clean: Store) -> None:
    """A Slurm-style build: one writer per task under its own prefix, then `manifest merge`
    of the parts' manifests into one manifest in the same store."""
    store = clean
    for task in (0, 1):
        with sk.ShardWriter(store.url(f"set/part-{task:04d}/"), maxcount=5, part=(task, 2)) as w:
            for s in samples(12, start=100 * task):
                w.write(s)
    runner = CliRunner()
    out = store.url("set/manifest.json")
    res = runner.invoke(
        cli, ["manifest", "merge", store.url("set/part-0000/manifest.json"), "-o", out]
    )
    said = res.output + str(res.exception or "")
    assert res.exit_code != 0 and "part 1 missing" in said, said
    w = sk.ShardWriter(store.url("set/part-0002/"), maxcount=2, part=(0, 1))
    for s in samples(6):
        w.write(s)
    w.next_shard()  # a task that died before close: its third shard is only journalled
    parts = store.url("set/part-{0000..0001}/manifest.json")
    res = runner.invoke(cli, ["manifest", "merge", parts, "-o", out, "--json"])
    assert res.exit_code == 0, res.output + str(res.exception or "")
    m = _remote(store, "set")
    assert m.shards[0].url == "part-0000/data-000000.tar"
    got = [str(s["__key__"]) for s in read_samples(m, make_opener())]
    assert got == [f"doc-{i:05d}" for i in range(12)] + [f"doc-{i:05d}" for i in range(100, 112)]
    res = runner.invoke(
        cli, ["manifest", "merge", store.url("set/part-0002/manifest.json"), "-o", out]
    )
    said = res.output + str(res.exception or "")
    assert res.exit_code != 0 and "did not finish" in said, said


_KILLED = """
import sys, numpy as np, shardkit as sk
w = sk.ShardWriter(sys.argv[1], maxcount=3, piece_size="64KB")
rng = np.random.default_rng(0)
for i in range(10_000):
    w.write({"__key__": f"doc-{i:05d}", "bin": rng.bytes(40_000)})
    if i == 10:
        print("going", flush=True)
"""


def test_a_writer_killed_mid_upload_resumes_from_what_is_there(clean: Store) -> None:
    """SIGKILL a writer in the middle of its uploads: no partial object is visible, and a
    resumed writer keeps exactly the shards that are whole and goes on after them."""
    import signal
    import subprocess
    import sys
    import time

    store = clean
    url = store.url("kill/")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, url], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"going"
    deadline = time.monotonic() + 60
    while len([n for n in store.names() if n.endswith(".tar")]) < 4:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    with sk.ShardWriter(url, maxcount=3, piece_size="64KB", resume=True) as again:
        kept = again.resumed_samples
        assert kept % 3 == 0 and kept >= 9
        rng = np.random.default_rng(0)
        for _ in range(kept):
            rng.bytes(40_000)  # the samples written before the kill
        for i in range(kept, kept + 5):
            again.write({"__key__": f"doc-{i:05d}", "bin": rng.bytes(40_000)})
    m = _remote(store, "kill")
    got = read_samples(m, make_opener())
    assert [s["__key__"] for s in got] == [f"doc-{i:05d}" for i in range(kept + 5)]
    rng = np.random.default_rng(0)
    assert all(s["bin"] == rng.bytes(40_000) for s in got)
    listed = {e.url for e in m.shards}
    assert {n.split("/")[-1] for n in store.names() if n.endswith(".tar")} == listed
