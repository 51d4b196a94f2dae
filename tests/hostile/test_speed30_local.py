"""Hostile pass on issue 30's verified local reads (2d9579d: one piece buffer a stream, a step
back over a piece's start reads and checks it again) and the lookups beside them: a piece
size past the shard's (a writer's piece_size larger than its shards: the manifest is valid),
a file truncated or extended between two reads of one open stream."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from shardkit import IndexedShards, ShardDataset
from shardkit._types import ObjectRef
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest
from shardkit.io.local import open_local
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced

PIECE = 4096


def _set(out: Path, piece_size: int | str, n: int = 6) -> list[bytes]:
    rng = random.Random(3)
    blobs = [rng.randbytes(rng.randrange(1, 9000)) for _ in range(n)]
    with unsynced(), ShardWriter(out, prefix="d", maxcount=3, piece_size=piece_size) as w:
        for i, b in enumerate(blobs):
            w.write({"__key__": f"k{i}", "bin": b})
    return blobs


def test_a_piece_size_past_the_shards_reads_every_sample(tmp_path: Path) -> None:
    # a 2 TB piece of a 30 KB shard: the stream allocated a buffer of the piece size
    # (MemoryError: 'Unable to allocate 1.82 TiB'), not of the shard's largest piece
    blobs = _set(tmp_path, "2TB")
    got = {s["__key__"]: bytes(s["bin"]) for s in ShardDataset(tmp_path)}
    assert got == {f"k{i}": b for i, b in enumerate(blobs)}


def test_lookups_with_a_piece_size_past_the_shards(tmp_path: Path) -> None:
    blobs = _set(tmp_path, "2TB")
    ds = IndexedShards(tmp_path)
    assert [bytes(ds[i]["bin"]) for i in range(len(blobs))] == blobs


def _one_shard(tmp_path: Path) -> tuple[Path, bytes, ObjectRef]:
    _set(tmp_path, PIECE, n=3)
    e = Manifest.load(tmp_path / "manifest.json").shards[0]
    path = tmp_path / e.url
    assert e.pieces is not None and e.pieces.size == PIECE and e.size > 2 * PIECE + 100
    return path, path.read_bytes(), ObjectRef(str(path), e.size, e.checksum, e.pieces)


def test_a_file_truncated_between_reads_is_a_checksum_error(tmp_path: Path) -> None:
    path, data, ref = _one_shard(tmp_path)
    with open_local(ref) as f:
        assert f.read(PIECE + 5) == data[: PIECE + 5]
        os.truncate(path, PIECE + 100)  # piece 1 is held; piece 2 is gone
        assert f.read(10) == data[PIECE + 5 : PIECE + 15]  # from the held, checked piece
        f.seek(2 * PIECE)
        with pytest.raises(ChecksumError, match="piece 2"):
            f.read(1)
        f.seek(PIECE - 1)  # back over piece 1's start: piece 0 read again, whole
        assert f.read(1) == data[PIECE - 1 : PIECE]
        with pytest.raises(ChecksumError, match="piece 1"):
            f.read(1)  # piece 1 read again: short now


def test_a_file_extended_between_reads_gives_the_manifest_bytes(tmp_path: Path) -> None:
    path, data, ref = _one_shard(tmp_path)
    with open_local(ref) as f:
        assert f.read(PIECE) == data[:PIECE]
        with open(path, "ab") as g:
            g.write(b"\0" * 5000)
        assert f.read() == data[PIECE:]
        f.seek(0, os.SEEK_END)
        assert f.tell() == len(data)
