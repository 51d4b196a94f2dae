"""Hostile pass on issue 30's writer (6caffad/f951405: parts written unjoined with writev,
hashed ~512 KiB at a time): fields at every size the grouping turns on (0, one block, 64
KiB, 512 KiB, each +-1), bytes-like values of every kind, a caller's buffer changed after
``write`` returned; the file, its manifest checksum and pieces, GNU tar and webdataset
agree, plain and compressed."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from shardkit.format.manifest.model import Manifest
from shardkit.format.pieces import piece_digest
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced
from tests.helpers.tarcorpus import listed_files, webdataset_samples

SIZES = [0, 1, 511, 512, 513, 65535, 65536, 65537, 524287, 524288, 524289]


def _payload(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("compress", [None, "zstd", "gzip"])
def test_every_field_size_and_kind_is_written_as_given(
    tmp_path: Path, compress: str | None
) -> None:
    want: list[dict[str, Any]] = []
    kept: list[tuple[bytearray, np.ndarray]] = []
    with unsynced(), ShardWriter(tmp_path, prefix="d", piece_size=4096, compress=compress) as w:
        for i, n in enumerate(SIZES):
            data = _payload(n, i)
            buf = bytearray(data)
            ints = np.arange(n // 64 * 2 + 2, dtype=np.int32)[::2]  # not contiguous
            npy = io.BytesIO()
            np.save(npy, np.ascontiguousarray(ints))
            w.write(
                {
                    "__key__": f"k{i:03d}",
                    "a.bin": buf,
                    "b.bin": memoryview(data)[: n % 70000],
                    "c.bin": data[:600],
                    "d.npy": ints,
                }
            )
            kept.append((buf, ints))
            fields = {"a.bin": data, "b.bin": data[: n % 70000], "c.bin": data[:600]}
            want.append({"__key__": f"k{i:03d}", **fields, "d.npy": npy.getvalue()})
        for buf, ints in kept:  # the caller reuses its buffers before the shard is flushed
            buf[:] = b"\xff" * len(buf)
            ints[...] = -1
    (entry,) = Manifest.load(tmp_path / "manifest.json").shards
    raw = (tmp_path / entry.url).read_bytes()
    assert entry.size == len(raw)
    assert entry.checksum == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert entry.pieces is not None
    pieces = [raw[k : k + 4096] for k in range(0, len(raw), 4096)]
    assert list(entry.pieces.digests) == [piece_digest(p) for p in pieces]
    tar = raw
    if compress == "zstd":
        tar = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    elif compress == "gzip":
        tar = gzip.decompress(raw)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar)
    with tarfile.open(plain) as tf:
        names = tf.getnames()
        got = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
    assert listed_files("tar", plain) == names
    assert got == {f"{s['__key__']}.{f}": v for s in want for f, v in s.items() if f != "__key__"}
    assert webdataset_samples(plain) == want
