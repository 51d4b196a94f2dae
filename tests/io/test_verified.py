"""The one piece verifier (:mod:`shardkit.io.verified`) over local shard files."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.reader import read_shard
from shardkit.io.verified import PieceCheck, VerifiedFile

PIECE = 32_000


@pytest.fixture
def shard(make_shards: Callable[..., Manifest]) -> tuple[ObjectRef, bytes]:
    m = make_shards([10], tokens=3000, piece_size=PIECE)
    e = m.shards[0]
    path = m.resolve(e.url)
    return ObjectRef(path, e.size, e.checksum, e.pieces), Path(path).read_bytes()


def test_a_whole_read_and_a_ranged_read_give_the_bytes(shard: tuple[ObjectRef, bytes]) -> None:
    ref, data = shard
    with VerifiedFile(open(ref.url, "rb"), ref) as f:
        assert f.read() == data
        assert [s["__key__"] for s in read_shard(io.BytesIO(data))][:1] == ["sample-00000000"]
    lo, hi = PIECE + 5, 3 * PIECE - 7
    with VerifiedFile(open(ref.url, "rb"), ref, start=lo, end=hi) as f:
        assert f.read() == data[lo:hi]


def test_a_flipped_byte_names_its_piece_before_any_of_it_is_read(
    shard: tuple[ObjectRef, bytes], tmp_path: Path
) -> None:
    ref, data = shard
    bad = bytearray(data)
    bad[2 * PIECE + 10] ^= 1
    path = tmp_path / "bad.tar"
    path.write_bytes(bad)
    with VerifiedFile(open(path, "rb"), ref) as f:
        assert f.read(PIECE) + f.read(PIECE) == data[: 2 * PIECE]  # the pieces before it
        with pytest.raises(ChecksumError, match=r"piece 2 \(bytes 64000\.\.96000\)") as info:
            f.read(1)
    assert info.value.url == ref.url
    # a ranged read that does not touch piece 2 never reads it
    with VerifiedFile(open(path, "rb"), ref, start=3 * PIECE, end=4 * PIECE) as f:
        assert f.read() == data[3 * PIECE : 4 * PIECE]
    # the hook: the rest comes from a good copy
    with VerifiedFile(open(path, "rb"), ref, on_bad=lambda pos, _: io.BytesIO(data[pos:])) as f:  # type: ignore[arg-type, return-value]
        assert f.read() == data


def test_pieces_of_other_bytes_are_caught_by_the_whole_checksum(
    shard: tuple[ObjectRef, bytes], make_shards: Callable[..., Manifest]
) -> None:
    ref, _ = shard
    other = make_shards([10], tokens=3000, piece_size=PIECE, seed=1).shards[0]
    assert other.size == ref.size
    liar = ObjectRef(ref.url, ref.size, other.checksum, ref.pieces)
    with (
        pytest.raises(ChecksumError, match="pieces listed are not this shard"),
        VerifiedFile(open(ref.url, "rb"), liar) as f,
    ):
        f.read()
    check = PieceCheck(liar)
    assert check.count == 5 and check.span(4) == (4 * PIECE, ref.size)


def test_a_close_run_by_the_garbage_collector_under_a_held_lock_does_not_deadlock(
    shard: tuple[ObjectRef, bytes],
) -> None:
    """The garbage collector closes an abandoned stream (an iterator dropped mid-shard) in
    whatever thread allocates, and that thread may be inside the piece-buffer pool's or the
    counters' lock: the close must not wait on it (CI hung 80 minutes on this once)."""
    import threading

    from shardkit.counters import Counters
    from shardkit.io import local

    ref, data = shard
    counters = Counters()
    for lock in (local._spare_lock, local._memo_lock, counters._lock):
        f = local.open_local(ref)
        assert f.read(PIECE + 10) == data[: PIECE + 10]  # two piece buffers held

        def finalizer_in_the_lock(f: object = f, lock: object = lock) -> None:
            with lock:  # type: ignore[attr-defined]
                f.close()  # type: ignore[attr-defined]
                counters.add("closed")

        t = threading.Thread(target=finalizer_in_the_lock, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"close() waited on {lock!r} held by its own thread"
        assert f.closed
    assert counters.snapshot()["closed"] == 3
