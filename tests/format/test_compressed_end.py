"""A compressed shard read whole is read on to the end of its compressed stream, so its
integrity check runs (gzip's CRC-32 and length, zstd's frames and content checksum); a
sample-range read that ends before the archive does stops there."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shardkit import ShardDataset, read_shard
from shardkit.errors import ShardFormatError, ShardkitError
from shardkit.format.tario import read_index
from shardkit.io.config import IoConfig, ReaderLimits
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced

OFF = IoConfig(limits=ReaderLimits(verify="off"))
BLOBS = [bytes([i + 1]) * (900 * i + 1) for i in range(4)]
TRAILER = {"gzip": 8, "zstd": 4}


def _write(out: Path, compress: str, blobs: list[bytes] = BLOBS) -> Path:
    with unsynced(), ShardWriter(out, prefix="d", compress=compress) as w:
        for i, b in enumerate(blobs):
            w.write({"__key__": f"k{i}", "bin": b})
    (shard,) = out.glob("d-000000.tar.*")
    return shard


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_damaged_compressed_shard_is_never_samples(tmp_path: Path, compress: str) -> None:
    shard = _write(tmp_path, compress)
    data = shard.read_bytes()
    shard.write_bytes(data[: -TRAILER[compress]])
    with pytest.raises(ShardFormatError, match="truncated") as err:
        list(ShardDataset(tmp_path / shard.name, io=OFF))
    assert err.value.url is not None and shard.name in err.value.url
    assert err.value.offset is not None
    wrong = 0
    for at in range(len(data)):  # some flips change nothing (gzip's mtime): no error needed
        bad = bytearray(data)
        bad[at] ^= 0x10
        shard.write_bytes(bytes(bad))
        try:
            got = [bytes(s["bin"]) for s in read_shard(shard)]
        except ShardkitError:
            continue
        wrong += got != BLOBS
    assert wrong == 0


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_range_read_stops_at_its_end(tmp_path: Path, compress: str) -> None:
    tail = random.Random(5).randbytes(3 << 20)  # incompressible: its end is far away
    shard = _write(tmp_path, compress, [*BLOBS, tail])
    offsets = read_index((tmp_path / ".index" / f"{shard.name}.idx").read_bytes())
    shard.write_bytes(shard.read_bytes()[: -TRAILER[compress]])  # its end not its to check
    got = list(read_shard(shard, start=offsets[1], end=offsets[3]))
    assert [bytes(s["bin"]) for s in got] == BLOBS[1:3]
    with pytest.raises(ShardFormatError, match="truncated"):
        list(read_shard(shard, start=offsets[1]))  # to the end: the end is checked
