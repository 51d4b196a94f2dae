"""Local shards are verified before a byte is visible, through every entry point.

One flipped byte in a shard whose manifest has a checksum, read with ``handler="raise"``:
``ShardDataset`` in one process, ``WebLoader`` with two worker processes, a cache dir with
``cache_verify="open"`` and ``shardkit bench`` all raise a :class:`ChecksumError` naming the
shard (and the piece, where the manifest has pieces), with pieces and without; no sample
of the bad piece (or of a bad shard without pieces) is handed out first. With each
sample's digest (a version 3 index the manifest vouches for) a local read checks sample by
sample: the error names the sample, and the samples before it come out. ``verify="off"``
reads the same bytes unchecked.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import ChecksumError, ShardDataset, WebLoader
from shardkit._types import ObjectRef
from shardkit.format.manifest.compact import compact_path
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig, ReaderLimits
from shardkit.io.config import IoConfig
from shardkit.io.local import open_local
from tests.helpers.indexes import as_version
from tests.helpers.readback import shardkit

MakeShards = Callable[..., Manifest]
PIECE = 4096

WITH_PIECES = {"piece_size": PIECE}
WITHOUT_PIECES = {"piece_size": None}


def _flip(manifest: Manifest, shard: int, at: int) -> tuple[Path, str]:
    """Flip one byte of member data of shard ``shard``, in the first member whose data
    starts at or after ``at``; the shard's path and url."""
    path = Path(manifest.resolve(manifest.shards[shard].url))
    with tarfile.open(path) as tar:
        where = next(m.offset_data for m in tar if m.offset_data >= at)
    data = bytearray(path.read_bytes())
    data[where + 10] ^= 0x40
    path.write_bytes(bytes(data))
    return path, str(manifest.shards[shard].url)


@pytest.fixture(params=["pieces", "no-pieces", "samples"])
def corrupt(request: pytest.FixtureRequest, make_shards: MakeShards) -> tuple[Path, str, str]:
    """A manifest of three shards whose second has one byte flipped in its third piece
    (in its sample 3); the path of the manifest, the bad shard's name and what the error
    must name. Without "samples" the indexes are version 2 (no digests: pieces checked)."""
    kwargs = WITHOUT_PIECES if request.param == "no-pieces" else WITH_PIECES
    m = make_shards([20, 40, 20], tokens=128, **kwargs)
    assert (m.shards[1].pieces is not None) == (request.param != "no-pieces")
    manifest = Path(m.base or "") / "manifest.json"
    if request.param != "samples":
        as_version(manifest, 2)
        Path(compact_path(str(manifest))).unlink()  # built from the manifest before
    at = 2 * PIECE
    _, name = _flip(m, 1, at)
    what = {"pieces": "piece 2", "no-pieces": "checksum differs", "samples": "sample 3 "}
    return manifest, name, what[request.param]


def _keys_before_error(it: Any) -> list[str]:
    keys: list[str] = []
    with pytest.raises(ChecksumError) as info:
        for sample in it:
            keys.append(str(sample["__key__"]))
    assert info.value.url is not None
    keys.append(str(info.value))
    return keys


@pytest.mark.timeout(60)
def test_dataset_in_one_process(corrupt: tuple[Path, str, str]) -> None:
    manifest, name, what = corrupt
    ds = ShardDataset(str(manifest), shardshuffle=False, handler="raise")
    keys = _keys_before_error(ds)
    assert name in keys[-1] and what in keys[-1], keys[-1]
    # the first shard (20 samples) is whole; of the bad one, nothing from its bad piece on
    # (4 KiB pieces hold 3 samples of 128 tokens; no samples at all without pieces), or
    # checked one by one, nothing from the bad sample on (of those before it, the ones
    # the reader had passed before it read the bad one's last byte)
    assert keys[:20] == [f"sample-{i:08d}" for i in range(20)]
    if "sample" in what:
        assert keys[20:-1] == [f"sample-{i:08d}" for i in range(20, len(keys) - 1)]
        assert len(keys) - 1 - 20 <= 3
    else:
        assert len(keys) - 1 - 20 < 8 if "piece" in what else len(keys) - 1 == 20


@pytest.mark.timeout(90)
def test_loader_with_two_workers(corrupt: tuple[Path, str, str]) -> None:
    manifest, name, what = corrupt
    loader = WebLoader(
        ShardDataset(str(manifest), shardshuffle=False, handler="raise"),
        num_workers=2,
        multiprocessing_context="fork",
    )
    with pytest.raises(ChecksumError) as info:
        list(loader)
    assert name in str(info.value) and what in str(info.value)


@pytest.mark.timeout(60)
def test_cache_verify_open(corrupt: tuple[Path, str, str], tmp_path: Path) -> None:
    manifest, name, what = corrupt
    io = IoConfig(cache=CacheConfig(cache_dir=tmp_path / "cache", cache_verify="open"))
    ds = ShardDataset(str(manifest), shardshuffle=False, handler="raise", io=io)
    with pytest.raises(ChecksumError) as info:
        list(ds)
    assert name in str(info.value) and what in str(info.value)


@pytest.mark.timeout(90)
def test_bench_cli(corrupt: tuple[Path, str, str]) -> None:
    manifest, name, what = corrupt
    r = shardkit("bench", manifest, "--workers", "2", "--batch-size", "4", "--seconds", "20")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert name in lines[0] and what in lines[0], lines[0]


@pytest.mark.timeout(60)
def test_verify_off_reads_the_bytes_unchecked(corrupt: tuple[Path, str, str]) -> None:
    manifest, _, _ = corrupt
    io = IoConfig(limits=ReaderLimits(verify="off"))
    ds = ShardDataset(str(manifest), shardshuffle=False, handler="raise", io=io)
    assert len(list(ds)) == 80


def test_a_good_shard_reads_whole_and_by_range(make_shards: MakeShards) -> None:
    for kwargs in (WITH_PIECES, WITHOUT_PIECES):
        m = make_shards([30], tokens=200, **kwargs)
        s = m.shards[0]
        path = m.resolve(s.url)
        raw = Path(path).read_bytes()
        for lo, hi in ((0, None), (5000, 9000), (PIECE - 1, PIECE + 1), (len(raw) - 3, None)):
            with open_local(ObjectRef(path, s.size, s.checksum, s.pieces), lo, hi) as f:
                assert f.read() == raw[lo:hi]


def test_a_file_of_another_size_is_refused_at_open(make_shards: MakeShards) -> None:
    m = make_shards([5], **WITH_PIECES)
    s = m.shards[0]
    path = Path(m.resolve(s.url))
    path.write_bytes(path.read_bytes() + b"\0" * 512)
    with pytest.raises(ChecksumError, match="size differs") as info:
        open_local(ObjectRef(str(path), s.size, s.checksum, s.pieces))
    assert info.value.url == str(path)


def test_a_shard_rewritten_after_its_whole_check_is_caught(make_shards: MakeShards) -> None:
    """Without pieces, the whole check is kept per file; a byte flipped in place afterwards
    (same size, and the mtime set back) is still caught by the computed piece digests."""
    import os

    m = make_shards([30], tokens=200, **WITHOUT_PIECES)
    s = m.shards[0]
    path = m.resolve(s.url)
    with open_local(ObjectRef(path, s.size, s.checksum)) as f:
        assert len(f.read()) == s.size
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with (
        pytest.raises(ChecksumError),
        open_local(ObjectRef(path, s.size, s.checksum)) as f,
    ):
        f.read()


def test_reads_and_seeks_across_pieces_give_the_file(make_shards: MakeShards) -> None:
    """The tar reader steps back over its buffer and reads in odd sizes: every read of a
    verified file, wherever it starts and ends, gives the file's bytes."""
    import random

    m = make_shards([40], tokens=300, **WITH_PIECES)
    s = m.shards[0]
    path = m.resolve(s.url)
    raw = Path(path).read_bytes()
    rng = random.Random(7)
    with open_local(ObjectRef(path, s.size, s.checksum, s.pieces), 1000) as f:
        assert f.seekable() and f.tell() == 1000
        for _ in range(300):
            if rng.random() < 0.3:
                f.seek(-min(f.tell() - 1000, rng.randrange(3 * PIECE)), 1)
            at = f.tell()
            n = rng.randrange(1, 3 * PIECE)
            assert f.read(n) == raw[at : at + n]
