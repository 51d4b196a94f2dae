"""A verified local read holds one piece: a step back over a piece's start reads and checks
that piece again, so every byte handed out is right, and a piece changed on disk since it
was first read is a ChecksumError when it is read again, never its new bytes."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.errors import ChecksumError
from shardkit.format.digest import Digest
from shardkit.io.local import open_local

PIECE = 4096


def _shard(tmp_path: Path) -> tuple[Path, bytes, ObjectRef]:
    data = random.Random(5).randbytes(5 * PIECE + 123)
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    digest = Digest("sha256", PIECE)
    digest.update(data)
    assert digest.pieces is not None
    ref = ObjectRef(str(path), len(data), digest.checksum(), digest.pieces.result())
    return path, data, ref


def test_steps_back_over_piece_starts_give_the_right_bytes(tmp_path: Path) -> None:
    _, data, ref = _shard(tmp_path)
    rng = random.Random(7)
    with open_local(ref) as f:
        for _ in range(300):
            pos = rng.randrange(len(data))
            n = rng.choice([1, 100, PIECE - 1, PIECE + 7, 3 * PIECE])
            f.seek(pos)
            assert f.read(n) == data[pos : pos + n]
        f.seek(PIECE * 3 - 10)
        assert f.read(20) == data[PIECE * 3 - 10 : PIECE * 3 + 10]
        f.seek(-30, io.SEEK_CUR)  # back over the start of piece 3
        assert f.read(30) == data[PIECE * 3 - 20 : PIECE * 3 + 10]


def test_a_piece_changed_after_it_was_read_is_refused_when_read_again(tmp_path: Path) -> None:
    path, data, ref = _shard(tmp_path)
    with open_local(ref) as f:
        assert f.read(PIECE + 10) == data[: PIECE + 10]  # piece 1 is the one held now
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"X", 5)  # piece 0 changes under the open reader
        finally:
            os.close(fd)
        f.seek(0)
        with pytest.raises(ChecksumError, match="piece 0"):
            f.read(10)
