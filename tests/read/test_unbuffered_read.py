"""The tar reader's unbuffered read of large members runs on every path (issue 22).

``ShardDataset`` counts the bytes it reads; the count must not hide that the stream can
seek, or the reader falls back to buffered reads and copies (the loader path read medium
shards at 38% of a raw read where ``read_shard`` read them at 51%). Whole shards and sample
ranges (a rank's share, a resume), verified or not, plain or zstd-compressed, give the same
samples as ``read_shard``, and the bytes counted are the bytes the range covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, read_shard
from shardkit.format.tario.buffer import Buffered
from shardkit.io import ReaderLimits
from shardkit.io.config import IoConfig
from shardkit.write.writer import ShardWriter

BIG = 100_000  # above the reader's unbuffered-read threshold (64 KiB)


def _write(out: Path, n: int, **kwargs: Any) -> Path:
    with ShardWriter(out, prefix="data", maxsize="2GB", **kwargs) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:04d}", "bin": bytes([i % 251]) * BIG, "cls": str(i)})
    return out / "manifest.json"


@pytest.fixture
def unbuffered_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the unbuffered reads the tar reader makes (the real method still runs)."""
    calls: list[int] = []
    real = Buffered._take_unbuffered

    def spy(self: Buffered, n: int, what: str | None, at: int, name: str = "") -> bytes:
        calls.append(n)
        return real(self, n, what, at, name)

    monkeypatch.setattr(Buffered, "_take_unbuffered", spy)
    return calls


@pytest.mark.parametrize("verify", ["on", "off"])
def test_the_dataset_reads_large_members_unbuffered(
    tmp_path: Path, unbuffered_calls: list[int], verify: str
) -> None:
    manifest = _write(tmp_path / "set", 30)
    ds = ShardDataset(
        str(manifest), shardshuffle=False, io=IoConfig(limits=ReaderLimits(verify=verify))
    )
    got = list(ds)
    assert [s["bin"] for s in got] == [bytes([i % 251]) * BIG for i in range(30)]
    assert unbuffered_calls.count(BIG) >= 20, unbuffered_calls


@pytest.mark.parametrize("verify", ["on", "off"])
def test_ranges_match_read_shard(tmp_path: Path, unbuffered_calls: list[int], verify: str) -> None:
    """Two ranks split one shard by sample range: each reads its half unbuffered."""
    manifest = _write(tmp_path / "set", 30)
    want = [s["__key__"] for s in read_shard(tmp_path / "set" / "data-000000.tar")]
    unbuffered_calls.clear()
    keys = []
    for rank in (0, 1):
        ds = ShardDataset(
            str(manifest), shardshuffle=False, io=IoConfig(limits=ReaderLimits(verify=verify))
        )
        keys += [s["__key__"] for s in ds.split_by_node(rank=rank, world_size=2)]
    assert sorted(keys) == want
    assert unbuffered_calls.count(BIG) >= 15, unbuffered_calls


def test_read_shard_opens_a_range_of_plain_and_compressed_shards_alike(tmp_path: Path) -> None:
    """One ``open_range`` for both: a path seeks in a plain tar and decompresses up to
    ``start`` in a zstd one."""
    import tarfile

    import zstandard

    _write(tmp_path / "set", 6, piece_size=None)
    src = tmp_path / "set" / "data-000000.tar"
    with tarfile.open(src) as tar:
        start = [m.offset for m in tar][2 * 2]  # sample 2's first member (two a sample)
    want = [s["__key__"] for s in read_shard(src)][2:]
    packed = tmp_path / "data-000000.tar.zst"
    packed.write_bytes(zstandard.ZstdCompressor().compress(src.read_bytes()))
    for path in (src, packed):
        assert [s["__key__"] for s in read_shard(path, start=start)] == want
