"""`shardkit build -o s3://...` and `manifest from-shards -o s3://...` through the real CLI in
a process of its own, against moto's server (and Azurite, the GCS emulator) on 127.0.0.1:
workers, parts merged in the store, a build killed mid-upload and resumed, overwrite,
adoption into the store."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkit.cache import make_opener
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.io import load_manifest
from shardkit.write.writer.object_lock import LEASE
from tests.helpers.readback import read_samples, shardkit, write_jsonl
from tests.helpers.stores import Store, object_store

pytestmark = pytest.mark.integration

FILES, RECORDS = 2, 60


@pytest.fixture(scope="module")
def s3() -> Iterator[Store]:
    with object_store("s3") as s:
        yield s


@pytest.fixture
def store(s3: Store) -> Iterator[Store]:
    yield s3
    s3.clear()
    for up in s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []):
        s3.client.abort_multipart_upload(Bucket=s3.bucket, Key=up["Key"], UploadId=up["UploadId"])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two JSONL files of records of 2-12 KB (keys f0-0000 ...)."""
    root = tmp_path_factory.mktemp("in")
    for f in range(FILES):
        write_jsonl(
            root / f"part-{f}.jsonl",
            (
                {"id": f"f{f}-{i:04d}", "text": "x" * (2000 + (i * 7919) % 10_000)}
                for i in range(RECORDS)
            ),
        )
    return root


def build(inputs: Path, out: str, *args: str) -> subprocess.CompletedProcess[str]:
    return shardkit("build", inputs, "-o", out, "--key-field", "id", "--maxcount", "10", *args)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def remote(store: Store, key: str) -> Manifest:
    return load_manifest(store.url(key), make_opener())


def samples_of(m: Manifest) -> list[tuple[str, bytes]]:
    return [(str(s["__key__"]), bytes(s["json"])) for s in read_samples(m, make_opener())]


@pytest.fixture(scope="module")
def local(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """The same inputs built locally with 2 workers: what every build in the store must hold."""
    out = tmp_path_factory.mktemp("local")
    ok(build(inputs, str(out), "--workers", "2"))
    return Manifest.load(out / "manifest.json")


def shards_in(store: Store, prefix: str) -> set[str]:
    return {k[len(prefix) :] for k in store.names() if k.startswith(prefix) and k.endswith(".tar")}


def test_build_with_workers_into_s3_reads_back_as_the_local_build(
    store: Store, inputs: Path, local: Manifest
) -> None:
    out = ok(build(inputs, store.url("ds/"), "--workers", "2"))
    assert "with 2 workers" in out and "manifest: s3://" in out
    m = remote(store, "ds/manifest.json")
    assert samples_of(m) == samples_of(local)  # every sample, byte for byte, in order
    # the same shard bytes, under the workers' own names (no copy in the store)
    assert [(e.checksum, e.nsamples) for e in m.shards] == [
        (e.checksum, e.nsamples) for e in local.shards
    ]
    assert {e.url for e in m.shards} == shards_in(store, "ds/")
    assert all(e.url.startswith(("data-w0000-", "data-w0001-")) for e in m.shards)
    assert not [k for k in store.names() if ".work-" in k or ".journal" in k]
    assert json.loads(store.get("ds/.manifest.json.etags.json")).keys() == {e.url for e in m.shards}
    ok(shardkit("verify", store.url("ds/manifest.json"), "--deep"))
    again = ok(build(inputs, store.url("ds/"), "--workers", "2"))
    assert again.startswith("nothing to do")


def test_parts_built_into_s3_merge_there(store: Store, inputs: Path, local: Manifest) -> None:
    for i in (0, 1):
        ok(build(inputs, store.url("parts/"), "--part", f"{i}/2"))
    parts = store.url("parts/manifest.part-{0000..0001}-of-0002.json")
    ok(shardkit("manifest", "merge", parts, "-o", store.url("parts/manifest.json")))
    m = remote(store, "parts/manifest.json")
    got = samples_of(m)
    assert sorted(got) == sorted(samples_of(local))  # every sample once
    assert len({k for k, _ in got}) == len(got) == FILES * RECORDS
    ok(shardkit("verify", store.url("parts/manifest.json")))


def _listed_whole(store: Store, prefix: str) -> int:
    """Every manifest in the store under ``prefix`` lists only objects there with the size
    it says; how many shards they list."""
    sizes = {k: len(store.get(k)) for k in store.names() if k.startswith(prefix)}
    listed = 0
    for key in sizes:
        name = key[len(prefix) :]
        if name == "manifest.json" or re.fullmatch(r"\.data\.work-w\d{4}\.json", name):
            m = Manifest.loads(store.get(key))
            for e in m.shards:
                assert sizes.get(prefix + e.url) == e.size, (key, e.url)
            listed += len(m.shards)
    return listed


def test_a_build_killed_mid_upload_resumes_to_every_sample_once(
    store: Store, inputs: Path, local: Manifest
) -> None:
    """SIGKILL the build and its workers (the whole process group, as a node dies) once
    shards are in the store; nothing partial is listed, and --resume finishes it."""
    argv = [sys.executable, "-m", "shardkit", "build", str(inputs), "-o", store.url("kill/")]
    argv += ["--key-field", "id", "--maxcount", "5", "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(shards_in(store, "kill/")) < 6:  # the store's listing: shards are whole there
        assert proc.poll() is None, "the build ended before it was killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    said = incomplete_reason(Manifest.loads(store.get("kill/manifest.json")))  # unfinished
    assert said is not None and "--resume" in said
    _listed_whole(store, "kill/")
    res = ok(shardkit("build", *argv[4:], "--resume"))
    assert "resumed: kept" in res
    m = remote(store, "kill/manifest.json")
    got = samples_of(m)
    assert got == samples_of(local)  # every sample once, in order, byte for byte
    assert {e.url for e in m.shards} == shards_in(store, "kill/")  # no stray object
    assert _listed_whole(store, "kill/") == len(m.shards)
    assert not [k for k in store.names() if ".work-" in k]
    ok(shardkit("verify", store.url("kill/manifest.json"), "--deep"))


def test_overwrite_replaces_a_data_set_in_s3(store: Store, inputs: Path, local: Manifest) -> None:
    ok(build(inputs, store.url("ow/"), "--workers", "2", "--maxcount", "7"))
    before = set(store.names())
    refused = build(inputs, store.url("ow/"))
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert set(store.names()) == before
    ok(build(inputs, store.url("ow/"), "--overwrite"))
    m = remote(store, "ow/manifest.json")
    assert samples_of(m) == samples_of(local)
    keys = {k[3:] for k in store.names() if k.startswith("ow/")}
    want = {e.url for e in m.shards} | {index_name(e.url) for e in m.shards}
    want |= {"manifest.json", "manifest.csv", ".manifest.json.etags.json"}
    assert keys == want  # nothing of the old set (its worker-named shards) is left


def test_from_shards_writes_manifest_and_indexes_into_s3(
    store: Store, local: Manifest, tmp_path: Path
) -> None:
    base = Path(str(local.base))
    for e in local.shards:
        store.put(f"adopt/{e.url}", (base / e.url).read_bytes())  # shards only, no index
    pattern = store.url(f"adopt/data-{{000000..{len(local.shards) - 1:06d}}}.tar")
    ok(shardkit("manifest", "from-shards", pattern, "-o", store.url("adopt/"), "--no-progress"))
    m = remote(store, "adopt/manifest.json")
    assert [e.url for e in m.shards] == [e.url for e in local.shards] and not m.origins
    assert [e.checksum for e in m.shards] == [e.checksum for e in local.shards]
    assert all(f"adopt/{index_name(e.url)}" in store.names() for e in m.shards)
    ok(shardkit("verify", store.url("adopt/manifest.json"), "--deep"))
    refused = shardkit("manifest", "from-shards", str(base), "-o", store.url("x/"))
    assert refused.returncode == 2 and "upload the shards first" in refused.stderr


def test_a_build_locked_by_another_is_refused_and_a_stale_lock_taken_over(
    store: Store, inputs: Path
) -> None:
    """The lock objects of a live build (this test process stands for it) stop a second
    build naming the holder; the lock of one not renewed for the lease is taken over (a
    killed build's lock on this host: the kill test's --resume)."""
    now = time.time()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": now, "renewed": now}
    store.put("lk/.lock-manifest.json", json.dumps(holder).encode())
    res = build(inputs, store.url("lk/"))
    assert res.returncode == 1 and f"pid {os.getpid()} on host" in res.stderr, res.stderr
    assert [k for k in store.names() if k.startswith("lk/")] == ["lk/.lock-manifest.json"]
    gone = {**holder, "host": "another-host", "renewed": now - LEASE - 60}
    store.put("lk/.lock-manifest.json", json.dumps(gone).encode())
    ok(build(inputs, store.url("lk/")))
    assert not [k for k in store.names() if ".lock-" in k]  # let go at the end


def test_skipped_records_of_the_workers_are_reported_beside_the_manifest_in_s3(
    store: Store, tmp_path: Path
) -> None:
    for f in range(2):
        lines = [json.dumps({"id": f"f{f}-{i:03d}", "text": "y" * 3000}) for i in range(30)]
        lines.insert(7 + f, "{not json")
        (tmp_path / f"p{f}.jsonl").write_text("\n".join(lines) + "\n")
    res = ok(build(tmp_path, store.url("bad/"), "--workers", "2", "--on-error", "skip"))
    assert "skipped 2 bad records" in res and "s3://" in res
    m = remote(store, "bad/manifest.json")
    assert m.total_samples == 60 and m.created["build"]["skipped_records"] == 2
    report = [json.loads(x) for x in store.get("bad/manifest.errors.jsonl").splitlines()]
    assert [(r["source"].split("/")[-1], r["line"]) for r in report] == [
        ("p0.jsonl", 8),
        ("p1.jsonl", 9),
    ]
    assert not [k for k in store.names() if ".work-" in k]


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_build_into_gcs_and_azure(scheme: str, inputs: Path, local: Manifest) -> None:
    with object_store(scheme) as store:
        ok(build(inputs, store.url("ds/"), "--workers", "2"))
        m = remote(store, "ds/manifest.json")
        assert samples_of(m) == samples_of(local)
        assert {e.url for e in m.shards} == shards_in(store, "ds/")
        ok(shardkit("verify", store.url("ds/manifest.json"), "--deep"))
