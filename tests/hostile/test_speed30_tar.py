"""Hostile pass on issue 30's tar reader (35ff479: composed of a byte layer and a member
reader) and the one-sample parse of lookups: a shard cut at block boundaries (and a byte
either side) through read_shard, ShardDataset and IndexedShards (verify off: the tar reader
is the only check) is an error or every sample right; a compressed shard cut inside its
integrity trailer is refused, as GNU tar refuses it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import IndexedShards, ShardDataset, read_shard
from shardkit.errors import ShardFormatError, ShardkitError
from shardkit.io.config import IoConfig, ReaderLimits
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced

OFF = IoConfig(limits=ReaderLimits(verify="off"))
BLOBS = [bytes([i + 1]) * (700 * i + 1) for i in range(3)]


def _write(out: Path, **kwargs: Any) -> Path:
    with unsynced(), ShardWriter(out, prefix="d", **kwargs) as w:
        for i, b in enumerate(BLOBS):
            w.write({"__key__": f"k{i}", "bin": b, "json": {"i": i}})
    (shard,) = out.glob("d-000000.tar*")
    return shard


def test_a_cut_shard_is_an_error_or_every_sample_right(tmp_path: Path) -> None:
    shard = _write(tmp_path)
    data = shard.read_bytes()
    cuts = sorted({c + d for c in range(0, len(data), 512) for d in (-1, 0, 1)} - {-1})
    readers: dict[str, Callable[[], list[Any]]] = {
        "read_shard": lambda: list(read_shard(str(shard))),
        "ShardDataset": lambda: list(ShardDataset(tmp_path, io=OFF)),
        "IndexedShards": lambda: [IndexedShards(tmp_path, io=OFF)[i] for i in range(3)],
    }
    for cut in cuts:
        shard.write_bytes(data[:cut])
        for name, read in readers.items():
            try:
                got = read()
            except ShardkitError:
                continue
            assert sorted(bytes(s["bin"]) for s in got) == BLOBS, f"{name}, cut at {cut}"


@pytest.mark.parametrize(("compress", "trailer"), [("gzip", 8), ("zstd", 4)])
def test_a_compressed_shard_cut_before_its_check_is_refused(
    tmp_path: Path, compress: str, trailer: int
) -> None:
    shard = _write(tmp_path, compress=compress)
    cut = tmp_path / f"cut{shard.name[len('d-000000') :]}"
    cut.write_bytes(shard.read_bytes()[:-trailer])
    gnu = subprocess.run(["tar", "-tf", str(cut)], capture_output=True, check=False)
    assert gnu.returncode != 0, "GNU tar reads it"  # 'unexpected end of file'
    with pytest.raises(ShardFormatError):
        list(read_shard(str(cut)))
