"""A verified read of a local shard whose manifest vouches for each sample's digest (a
version 3 index with its ``index_checksum``) checks it sample by sample as the tar reader
reads it: no sample whose bytes were not checked is handed out, a damaged one (its data,
one of its headers, bytes read again after a step back) is a ChecksumError naming the
shard, the sample and its offset, and no member can come from past the last sample."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from xxhash import xxh3_64

from shardkit import ChecksumError, ShardDataset, read_shard
from shardkit.cache import opener_for
from shardkit.format.layout import index_name
from shardkit.format.manifest.compact import compact_path
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import SampleDigester, parse_index, sample_digest, write_index
from shardkit.format.tario.writer import member_header
from shardkit.io.config import IoConfig
from shardkit.io.verified_samples import SampleVerified
from shardkit.read.catalog import open_catalog
from shardkit.read.stream import read_stream
from tests.helpers.indexes import put_index

MakeShards = Callable[..., Manifest]


def _set(make_shards: MakeShards, tokens: int) -> tuple[Path, Path, list[int]]:
    """One shard of 10 samples: the manifest, the shard's path, where each sample starts
    (and the last one ends)."""
    m = make_shards([10], tokens=tokens)
    base = Path(str(m.base))
    offsets = parse_index((base / index_name(m.shards[0].url)).read_bytes()).offsets
    assert parse_index((base / index_name(m.shards[0].url)).read_bytes()).version == 3
    return base / "manifest.json", base / m.shards[0].url, offsets.tolist()


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def _keys_then_error(it: Any) -> tuple[list[str], ChecksumError]:
    keys: list[str] = []
    with pytest.raises(ChecksumError) as info:
        for sample in it:
            keys.append(str(sample["__key__"]))
    return keys, info.value


# 64 tokens: samples of 1.5 KB, many in one buffered read; 30,000: a 120 KB member read
# into its own object, the reader stepping back over what it had buffered
@pytest.mark.parametrize("tokens", [64, 30_000])
def test_a_changed_byte_of_a_sample_is_refused_and_nothing_from_it_on_comes_out(
    make_shards: MakeShards, tokens: int
) -> None:
    manifest, shard, offsets = _set(make_shards, tokens)
    good = list(read_shard(shard))
    ds = list(ShardDataset(str(manifest), shardshuffle=False))
    assert [{k: v for k, v in s.items() if k != "__url__"} for s in ds] == good
    _flip(shard, offsets[6] + 1536 + 100)  # the tokens member's data (after json's)
    keys, err = _keys_then_error(ShardDataset(str(manifest), shardshuffle=False))
    assert keys == [str(s["__key__"]) for s in good[: len(keys)]] and len(keys) <= 6
    assert err.url == str(shard) and err.offset == offsets[6]
    assert f"sample 6 (bytes {offsets[6]}..{offsets[7]})" in str(err)


def test_a_damaged_header_is_the_samples_checksum_error(make_shards: MakeShards) -> None:
    manifest, shard, offsets = _set(make_shards, 30_000)
    _flip(shard, offsets[4] + 1024 + 2)  # the name in the tokens member's header
    keys, err = _keys_then_error(ShardDataset(str(manifest), shardshuffle=False))
    assert len(keys) <= 4 and err.offset == offsets[4] and "sample 4 " in str(err)
    # the reader met it before the sample's end (a header that does not parse): the rest
    # of the sample was read to name the damage
    assert "bad header checksum" in str(err.__context__)


def test_a_range_read_checks_the_samples_of_its_range(make_shards: MakeShards) -> None:
    manifest, shard, offsets = _set(make_shards, 2000)
    good = list(read_shard(shard))
    cfg = IoConfig()
    opener = opener_for(cfg)
    catalog = open_catalog(str(manifest), opener, io=cfg)

    def read(lo: int, hi: int) -> list[Any]:
        counts = {"samples": 0.0, "bytes": 0.0}
        rows = iter([(0, lo, hi, 0)])
        return [s for _, s in read_stream(rows, catalog, opener, counts, "raise", cfg.limits)]

    assert [s["__key__"] for s in read(3, 7)] == [s["__key__"] for s in good[3:7]]
    _flip(shard, offsets[8] + 1024 + 10)  # outside 3..7: not read, not checked
    assert [s["tokens.npy"] for s in read(3, 7)] == [s["tokens.npy"] for s in good[3:7]]
    _flip(shard, offsets[5] + 1024 + 10)
    with pytest.raises(ChecksumError, match="sample 5 ") as info:
        read(3, 7)
    assert info.value.offset == offsets[5]


def test_nothing_past_the_last_sample_becomes_a_member(make_shards: MakeShards) -> None:
    manifest, shard, offsets = _set(make_shards, 64)
    last = read_shard(shard)
    key = str(list(last)[-1]["__key__"])
    with open(shard, "r+b") as f:  # the end-of-archive marker becomes a field of the last key
        f.seek(offsets[-1])
        f.write(member_header(f"{key}.extra", 3) + b"bad".ljust(512, b"\0"))
    keys, err = _keys_then_error(ShardDataset(str(manifest), shardshuffle=False))
    assert key not in keys and err.offset == offsets[-1]
    assert "end-of-archive" in str(err)


def _stream(tmp_path: Path, data: bytes, bounds: list[int]) -> SampleVerified:
    path = tmp_path / "s.bin"
    path.write_bytes(data)
    digests = [sample_digest(data[a:b]) for a, b in itertools.pairwise(bounds)]
    f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed with the stream
    f.seek(bounds[0])
    return SampleVerified(f, url=str(path), bounds=bounds, digests=digests)  # type: ignore[arg-type]


def test_bytes_read_again_must_be_the_ones_checked(tmp_path: Path) -> None:
    data = os.urandom(8192)
    with _stream(tmp_path, data, [0, 3000, 8192]) as s:
        assert s.read(4000) == data[:4000] and s.verified_to == 3000
        s.seek(-2000, os.SEEK_CUR)  # the tar reader's step back before a large member
        assert s.read(3000) == data[2000:5000]
        with open(tmp_path / "s.bin", "r+b") as f:  # rewritten under the reader
            f.seek(4500)
            f.write(b"\0" * 10)
        s.seek(4100)
        with pytest.raises(ChecksumError, match="changed while they were read"):
            s.read(1000)


def test_a_step_back_goes_no_further_than_what_was_read(tmp_path: Path) -> None:
    data = os.urandom(4096)
    with _stream(tmp_path, data, [1024, 2048, 4096]) as s:
        with pytest.raises(OSError, match="steps back"):
            s.seek(1000)
        assert s.read(100) == data[1024:1124]
        with pytest.raises(OSError, match="steps back"):
            s.seek(1200)  # ahead of what was hashed
        assert s.read() == data[1124:4096] and s.verified_to == 4096


def test_an_index_that_cannot_be_read_leaves_a_whole_read_to_the_pieces(
    make_shards: MakeShards, caplog: pytest.LogCaptureFixture
) -> None:
    manifest, shard, offsets = _set(make_shards, 64)
    (shard.parent / index_name(shard.name)).unlink()
    good = list(read_shard(shard))
    got = list(ShardDataset(str(manifest), shardshuffle=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in good]
    assert "checked by the shard's pieces" in caplog.text
    _flip(shard, offsets[6] + 1536 + 100)
    with pytest.raises(ChecksumError, match="piece 0"):
        list(ShardDataset(str(manifest), shardshuffle=False))


def test_the_hash_fed_in_parts_is_the_sample_digest() -> None:
    # SampleVerified feeds xxhash's own object (not index.SampleDigester) as reads arrive
    data = os.urandom(70_001)
    h = xxh3_64()
    for a in range(0, len(data), 4096):
        h.update(data[a : a + 4096])
    whole = SampleDigester()
    whole.update(data)
    assert h.intdigest() == sample_digest(data) == whole.digest()


def test_what_follows_the_end_of_archive_marker_is_not_a_member(
    make_shards: MakeShards, caplog: pytest.LogCaptureFixture
) -> None:
    # a tar may go on after its marker (a tool's record padding, appended bytes): no
    # reader takes it for members, and a verified read gives every sample as read_shard
    manifest, shard, _ = _set(make_shards, 64)
    with open(shard, "ab") as f:
        f.write(b"junk after the marker".ljust(4096, b"\1"))
    checksum = "sha256:" + hashlib.sha256(shard.read_bytes()).hexdigest()
    doc = json.loads(manifest.read_text())
    entry = doc["shards"][0]
    doc["total_bytes"] += shard.stat().st_size - entry["size"]
    entry.update(size=shard.stat().st_size, checksum=checksum)
    entry.pop("pieces", None)
    manifest.write_text(json.dumps(doc))
    idx = parse_index((shard.parent / index_name(shard.name)).read_bytes())
    assert idx.signatures is not None and idx.digests is not None
    index = write_index(
        idx.offsets[:-1].tolist(), int(idx.offsets[-1]), signatures=idx.signatures.tolist(),
        shard_checksum=checksum, digests=idx.digests.tolist(),
    )  # fmt: skip
    put_index(manifest, 0, index)  # bound to the shard as it is now
    Path(compact_path(str(manifest))).unlink(missing_ok=True)
    got = list(ShardDataset(str(manifest), shardshuffle=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in read_shard(shard)]
    assert "checked by the shard's pieces" not in caplog.text  # read by its samples
