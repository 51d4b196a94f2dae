"""Whatever samples go into ShardWriter come back out of read_shard exactly."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import Manifest, ShardWriter, read_shard
from shardkit.tario.index import read_index
from shardkit.tario.reader import iter_samples

# any character a file name can hold, but the few the key rules refuse
_CHARS = st.characters(codec="utf-8", exclude_characters="/\\\0")
_DIR_PART = st.text(_CHARS, min_size=1, max_size=12).filter(lambda p: p not in (".", ".."))
_LAST_PART = st.text(st.characters(codec="utf-8", exclude_characters="/\\\0."), min_size=1)
_LONG_PART = st.text(st.sampled_from("abcdefghij_-éü字"), min_size=60, max_size=120)


@st.composite
def keys(draw: st.DrawFn) -> str:
    dirs = draw(st.lists(st.one_of(_DIR_PART, _LONG_PART), max_size=3))
    last = draw(st.one_of(_LAST_PART.map(lambda s: s[:20]), _LONG_PART))
    key = "/".join([*dirs, last])
    # "C:..." looks like a Windows drive; readers refuse it as absolute
    if len(key) >= 2 and key[1] == ":" and key[0].isascii() and key[0].isalpha():
        key = "k" + key
    return key


_FIELD = st.sampled_from(["txt", "json", "bin", "cls", "tokens.npy", "a.b.c", "x"])
_FIELDS = st.dictionaries(_FIELD, st.binary(max_size=3000), min_size=1, max_size=4)


@st.composite
def sample_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    ks = draw(st.lists(keys(), min_size=1, max_size=25, unique=True))
    return [{"__key__": k, **draw(_FIELDS)} for k in ks]


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
    assert len(m.shards) >= 2  # a 3 MB sample and another do not share a 4 MB shard


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
