"""Fuzzing as a test: mutated shards, indexes and manifests through every entry point.

Byte flips, truncations, splices of two valid shards and rewrites of header fields go
through read_shard, the structure scan (verify --deep, inspect, from-shards) and the
dataset's ranged reads; mutated indexes through the dataset; mutated manifests through
the loader. Only named shardkit errors may come out, in bounded time (pytest-timeout) and
memory (tracemalloc).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit import ShardDataset, ShardkitError, read_shard
from shardkit.check.scan import scan_shard
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.reader import TarReader
from tests.helpers.data import make_shards

_FIELDS = (0, 100, 124, 136, 148, 156, 157, 257, 345)  # name, size, mtime, chksum, type, ...


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    d = tmp_path_factory.mktemp("fuzz") / "set"
    m = make_shards(d, [4, 4], tokens=40)
    return d, m


def _bounded(fn: object) -> None:
    """Run ``fn()``: a shardkit error or nothing, and little memory."""
    tracemalloc.start()
    try:
        with contextlib.suppress(ShardkitError):
            fn()  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak} bytes"


def _mutate(data: bytes, other: bytes, kind: str, a: int, b: int, value: bytes) -> bytes:
    n = len(data)
    a, b = a % n, b % max(1, len(other))
    if kind == "flip":
        return data[:a] + bytes([data[a] ^ (value[0] or 1)]) + data[a + 1 :]
    if kind == "truncate":
        return data[:a]
    if kind == "splice":
        return data[:a] + other[b:]
    block = (a // 512) * 512  # a header field rewritten with arbitrary bytes
    field = block + _FIELDS[b % len(_FIELDS)]
    return data[:field] + value + data[field + len(value) :]


_MUTATION = st.tuples(
    st.sampled_from(["flip", "truncate", "splice", "field"]),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 20),
    st.binary(min_size=1, max_size=12),
)


@pytest.mark.timeout(120)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(_MUTATION)
def test_mutated_shards_through_every_reader(
    valid: tuple[Path, Manifest],
    tmp_path_factory: pytest.TempPathFactory,
    mutation: tuple[str, int, int, bytes],
) -> None:
    d, m = valid
    data = (d / m.shards[0].url).read_bytes()
    other = (d / m.shards[1].url).read_bytes()
    bad = _mutate(data, other, *mutation)
    path = tmp_path_factory.mktemp("mut") / "data-000000.tar"
    path.write_bytes(bad)
    _bounded(lambda: list(read_shard(path)))
    _bounded(lambda: list(read_shard(io.BytesIO(bad), url="mem.tar")))
    _bounded(lambda: list(TarReader(io.BytesIO(bad), keep_data=False).samples()))
    _bounded(lambda: scan_shard(str(path)))


@pytest.mark.timeout(180)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(_MUTATION, st.sampled_from(["shard", "index"]))
def test_mutated_shards_and_indexes_through_the_dataset(
    valid: tuple[Path, Manifest],
    tmp_path_factory: pytest.TempPathFactory,
    mutation: tuple[str, int, int, bytes],
    target: str,
) -> None:
    """The manifest vouches for the mutated bytes (size, checksums recomputed), so only the
    parse and the index checks stand between them and a training loop."""
    d, m = valid
    out = tmp_path_factory.mktemp("ds")
    doc = json.loads((d / "manifest.json").read_text())
    for s in m.shards:
        for name in (s.url, str(s.index)):
            (out / name).parent.mkdir(parents=True, exist_ok=True)  # an index's .index/
            (out / name).write_bytes((d / name).read_bytes())
    victim = m.shards[0].url if target == "shard" else str(m.shards[0].index)
    data = (out / victim).read_bytes()
    (out / victim).write_bytes(_mutate(data, data[::-1], *mutation))
    for e in doc["shards"]:
        e.pop("pieces", None)
        e.pop("index_checksum", None)  # ranged index reads: the index is not vouched for
        raw = (out / e["url"]).read_bytes()
        e["size"] = len(raw)
        e["checksum"] = "sha256:" + hashlib.sha256(raw).hexdigest()
    doc.pop("total_bytes", None)
    (out / "manifest.json").write_text(json.dumps(doc))

    def every_rank() -> None:
        keys: list[str] = []
        for rank in range(3):
            ds = ShardDataset(str(out / "manifest.json"), shardshuffle=False)
            keys += [s["__key__"] for s in ds.split_by_node(rank, 3)]
        # whatever was read without an error is the right data, each sample once
        assert len(keys) == len(set(keys)) and set(keys) <= {f"sample-{i:08d}" for i in range(8)}

    _bounded(every_rank)


@pytest.mark.timeout(60)
@settings(max_examples=150)
@given(st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8), st.booleans())
def test_mutated_manifests_are_manifest_errors(pos: int, value: bytes, cut: bool) -> None:
    text = json.dumps(
        {
            "format": "shardkit.manifest",
            "version": 1,
            "shards": [
                {"url": "a.tar", "size": 10, "nsamples": 2, "checksum": "sha256:" + "0" * 64},
                {"url": "b.tar", "size": 12, "nsamples": 3, "checksum": "sha256:" + "1" * 64},
            ],
        }
    ).encode()
    pos %= len(text)
    bad = text[:pos] if cut else text[:pos] + value + text[pos + len(value) :]
    for source in ("m.json", "m.csv"):
        with contextlib.suppress(ShardkitError):
            Manifest.loads(bad, source=source)
