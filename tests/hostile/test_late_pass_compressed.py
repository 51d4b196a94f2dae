"""Hostile pass on 4b2dbb4 (compressed shards read to their end): a compressed shard named
by its path alone (no manifest, no sample index beside it) is counted through its
decompressor, so ShardDataset reads it. Before, the sample count was taken by scanning the
compressed bytes as a tar: every such .tar.zst / .tar.gz was a ShardFormatError at byte 0.
Several zstd frames, skippable frames and concatenated gzip members read as one tar."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import zstandard

from shardkit import ShardDataset
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced

BLOBS = [bytes([i + 1]) * (700 * i + 1) for i in range(5)]


def _tar(out: Path) -> bytes:
    with unsynced(), ShardWriter(out, prefix="d") as w:
        for i, b in enumerate(BLOBS):
            w.write({"__key__": f"k{i}", "bin": b})
    return (out / "d-000000.tar").read_bytes()


def _skippable(n: int) -> bytes:
    return struct.pack("<II", 0x184D2A53, n) + b"\xaa" * n


def _zstd_frames(parts: list[bytes]) -> bytes:
    z = zstandard.ZstdCompressor(write_checksum=True)
    return _skippable(5) + _skippable(0).join(z.compress(p) for p in parts) + _skippable(3)


@pytest.mark.parametrize("kind", ["zst", "zst-frames", "gz", "gz-members"])
def test_a_lone_compressed_shard_path_reads_its_samples(tmp_path: Path, kind: str) -> None:
    tar = _tar(tmp_path / "w")
    parts = [tar[:700], tar[700:3000], tar[3000:]]
    data = {
        "zst": zstandard.ZstdCompressor(write_checksum=True).compress(tar),
        "zst-frames": _zstd_frames(parts),
        "gz": gzip.compress(tar),
        "gz-members": b"".join(gzip.compress(p) for p in parts),
    }[kind]
    lone = tmp_path / "lone"
    lone.mkdir()
    shard = lone / ("s.tar.zst" if kind.startswith("zst") else "s.tar.gz")
    shard.write_bytes(data)
    got = [bytes(s["bin"]) for s in ShardDataset(str(shard), shardshuffle=False)]
    assert got == BLOBS
