"""Issue 32 item 2: every write is retried. S3 parts and completes, GCS chunks and Azure
blocks and commits meet 503 SlowDown (ServerBusy) answers and connections dropped after the
store did the request, through a faulting proxy in front of the real emulators on
127.0.0.1 (moto, the GCS emulator, Azurite): the object is whole and right, and none is
visible before its commit; a build through ShardWriter into the bucket under SlowDowns
reads back right; a store that refuses forever ends in a FetchError naming the object."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from collections.abc import Iterator

import numpy as np
import pytest

from shardkit.errors import FetchError
from shardkit.io.retry import RetryPolicy
from shardkit.io.store_az import AzStore
from shardkit.io.store_base import ObjectStore
from shardkit.io.store_gs import GsStore
from shardkit.io.store_s3 import S3Store
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.stores import Store, object_store

pytestmark = pytest.mark.integration

FAST = RetryPolicy(backoff_base=0.01, backoff_max=0.05, deadline=30.0)
MiB = 1 << 20


@pytest.fixture(scope="module", params=["s3", "gs", "az"])
def emulated(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each emulated store, started once for the module."""
    with object_store(request.param) as st:
        yield st


@contextlib.contextmanager
def proxied(st: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A faulting proxy in front of ``st``; the environment points its clients at it."""
    if st.scheme == "s3":
        upstream = st.env["AWS_ENDPOINT_URL"]
    elif st.scheme == "gs":
        upstream = st.env["STORAGE_EMULATOR_HOST"]
    else:
        upstream = st.env["AZURE_STORAGE_CONNECTION_STRING"].split("BlobEndpoint=")[1]
    with FaultProxy(upstream) as px:
        for k, v in st.env.items():
            monkeypatch.setenv(k, v)
        if st.scheme == "s3":
            monkeypatch.setenv("AWS_ENDPOINT_URL", px.url)
        elif st.scheme == "gs":
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", px.url)
        else:
            conn = st.env["AZURE_STORAGE_CONNECTION_STRING"]
            port = upstream.split(":")[2].split("/")[0]
            mine = px.url.removeprefix("http://")
            monkeypatch.setenv(
                "AZURE_STORAGE_CONNECTION_STRING", conn.replace(f"127.0.0.1:{port}", mine)
            )
        yield px


def _store(scheme: str, bucket: str, proxy: FaultProxy, part_size: int) -> ObjectStore:
    store: ObjectStore
    if scheme == "s3":
        store = S3Store(bucket, endpoint_url=proxy.url, part_size=part_size)
    elif scheme == "gs":
        store = GsStore(bucket, part_size=part_size)
    else:
        store = AzStore(bucket, part_size=part_size)
    store.retry = FAST
    return store


# per scheme: the part size, and (method, pattern) of a part's write and of the commit
_PARTS = {
    "s3": (5 * MiB, ("PUT", r"partNumber=1\b"), ("PUT", r"partNumber=2\b"), ("POST", "uploadId=")),
    "gs": (256 << 10, ("PUT", r"upload_id="), ("PUT", r"upload_id="), None),
    "az": (MiB, ("PUT", r"comp=block\b"), ("PUT", r"comp=block\b"), ("PUT", "comp=blocklist")),
}


@pytest.mark.timeout(120)
def test_parts_and_commits_are_retried_and_no_partial_object_is_visible(
    emulated: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = emulated
    size, first, second, commit = _PARTS[st.scheme]
    data = os.urandom(size + 1000)  # two parts: one whole, one short
    with proxied(st, monkeypatch) as px:
        store = _store(st.scheme, st.bucket, px, size)
        px.add(*first, "slowdown", times=3)  # three SlowDowns stopped a build before
        px.add(*second, "lost")  # done by the store, its answer lost
        if commit is not None:
            px.add(*commit, "slowdown")
            px.add(*commit, "lost")
        up = store.upload("dir/obj.tar")
        up.write(data[:size])
        assert store.head("dir/obj.tar") is None  # a part is up, no object yet
        up.write(data[size:])
        up.complete()
        assert st.get("dir/obj.tar") == data
        statuses = px.answered(*first)
        assert statuses[:3] == [503, 503, 503], statuses
        assert 0 in px.answered(*second)
        counts = store.counters.snapshot()
        assert counts.get("retries", 0) >= (4 if commit is None else 6)
        assert counts.get("rate_cuts", 0) >= 1  # the node's write rate was lowered


@pytest.mark.timeout(60)
def test_small_objects_are_retried_and_a_store_that_refuses_forever_names_the_object(
    emulated: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = emulated
    with proxied(st, monkeypatch) as px:
        store = _store(st.scheme, st.bucket, px, _PARTS[st.scheme][0])
        method = "POST" if st.scheme == "gs" else "PUT"  # GCS puts a small object by POST
        px.add(method, "", "slowdown", times=2)
        store.put("small.json", b"{}")
        assert st.get("small.json") == b"{}"
        store.retry = dataclasses.replace(FAST, max_attempts=4)
        px.add(method, "", "slowdown", times=1000)
        with pytest.raises(FetchError) as err:
            store.put("never.json", b"{}")
        assert store.url("never.json") in str(err.value) and err.value.attempts == 4
        assert "never.json" not in st.names()


@pytest.mark.timeout(120)
def test_a_build_into_a_bucket_under_slowdowns_reads_back_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardkit import ShardWriter
    from shardkit.cache import make_opener
    from shardkit.io import load_manifest
    from tests.helpers.data import make_samples
    from tests.helpers.readback import read_samples

    with object_store("s3") as st, proxied(st, monkeypatch) as px:
        px.add("PUT", r"partNumber=", "slowdown", times=3)
        px.add("PUT", r"partNumber=", "lost")
        px.add("POST", "uploadId=", "slowdown")
        px.add("PUT", r"manifest", "slowdown")
        samples = list(make_samples(100, tokens=2000))
        with ShardWriter(f"s3://{st.bucket}/built", prefix="d", maxsize=400_000) as w:
            for s in samples:
                w.write(s)
        opener = make_opener()
        m = load_manifest(f"s3://{st.bucket}/built/manifest.json", opener)
        got = read_samples(m, opener)
        assert len(m.shards) >= 2
        assert [g["__key__"] for g in got] == [s["__key__"] for s in samples]
        for g, s in zip(got, samples, strict=True):
            assert json.loads(bytes(g["json"])) == s["json"]
            assert np.array_equal(np.load(io.BytesIO(bytes(g["tokens.npy"]))), s["tokens.npy"])
        assert 503 in px.answered("PUT", "partNumber=")
        assert 0 in px.answered("PUT", "partNumber=")
