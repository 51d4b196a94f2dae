"""Whatever samples go into ShardWriter come back out of read_shard exactly."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit import Manifest, ShardWriter, read_shard
from shardkit.format.tario.index import read_index
from shardkit.format.tario.reader import iter_samples
from tests.helpers.strategies import sample_lists


def read_all(out: str, manifest: Manifest) -> Iterator[dict[str, object]]:
    for entry in manifest.shards:
        yield from read_shard(os.path.join(out, entry.url))


def _roundtrip(samples: list[dict[str, Any]], **kwargs: Any) -> Manifest:
    with tempfile.TemporaryDirectory() as out:
        with ShardWriter(out, **kwargs) as w:
            for s in samples:
                w.write(s)
        manifest = Manifest.load(os.path.join(out, "manifest.json"))
        back = list(read_all(out, manifest))
        assert back == samples
        assert manifest.total_samples == len(samples)
        _check_indexes(out, manifest)
    return manifest


def _check_indexes(out: str, manifest: Manifest) -> None:
    for entry in manifest.shards:
        assert entry.index is not None
        index = read_index(Path(out, entry.index).read_bytes())
        path = os.path.join(out, entry.url)
        if path.endswith(".zst"):
            continue  # offsets are in the decompressed tar; checked in test_writer
        with open(path, "rb") as f:
            offsets = [off for off, _ in iter_samples(f, url=path)]
        assert index.tolist()[:-1] == offsets
        assert len(offsets) == entry.nsamples


@given(sample_lists(), st.sampled_from([None, 3]))
def test_roundtrip(samples: list[dict[str, Any]], maxcount: int | None) -> None:
    _roundtrip(samples, maxsize="16KB", maxcount=maxcount)


@settings(max_examples=15)
@given(sample_lists())
def test_roundtrip_zstd(samples: list[dict[str, Any]]) -> None:
    m = _roundtrip(samples, maxsize="16KB", compress="zstd")
    assert all(e.url.endswith(".tar.zst") for e in m.shards)


@settings(max_examples=3)
@given(st.integers(0, 2**32 - 1))
@example(404)  # three samples of 1.1-1.4 MB: one shard
@example(0)  # 2.7 + 1.1 MB, then 3.0 MB: two shards
def test_roundtrip_big_fields(seed: int) -> None:
    rng = random.Random(seed)
    samples = [
        {
            "__key__": f"big/{i}",
            "bin": rng.randbytes(rng.randint(1 << 20, 3 << 20)),
            "txt": b"",
        }
        for i in range(3)
    ]
    m = _roundtrip(samples, maxsize="4MB")
    payload = sum(len(s["bin"]) for s in samples)
    # samples of more than 4 MB together do not share a 4 MB shard (three of about 1.1 MB
    # do); a shard goes past the limit only when one sample alone does
    assert len(m.shards) >= (2 if payload > 4_000_000 else 1)
    assert all(e.size <= 4_000_000 or e.nsamples == 1 for e in m.shards)


def test_long_and_unicode_names_use_pax_only_where_needed() -> None:
    key_short = "d/s"
    key_long = "dir/" + "x" * 150  # > 100 bytes with no usable '/' split: pax path
    key_uni = "données/ключ"
    samples = [{"__key__": k, "txt": b"v"} for k in (key_short, key_long, key_uni)]
    with tempfile.TemporaryDirectory() as out:
        with ShardWriter(out) as w:
            for s in samples:
                w.write(s)
        data = Path(out, "data-000000.tar").read_bytes()
        assert data[156:157] == b"0"  # the short name: a plain ustar header
        assert data.count(b" path=") == 2
        assert list(read_shard(Path(out, "data-000000.tar"))) == samples
