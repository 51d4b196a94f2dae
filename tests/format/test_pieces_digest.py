"""HashingWriter.write_parts: what it writes and hashes is exactly the parts joined, on a
real file (writev, more parts than one call takes) and on a sink without a descriptor."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from shardkit.format.digest import Digest, HashingWriter
from shardkit.format.pieces import PieceHasher


def _parts() -> list[bytes | bytearray | memoryview]:
    rng = np.random.default_rng(3)
    parts: list[bytes | bytearray | memoryview] = []
    for i in range(1500):  # more than one writev's 1024 and many 512 KiB groups
        n = int(rng.integers(0, 3000)) if i % 50 else 300_000
        kind = i % 3
        if kind == 0:
            parts.append(rng.bytes(n))
        elif kind == 1:
            parts.append(bytearray(rng.bytes(n)))
        else:  # a view of int32s: written as its bytes, not as items
            parts.append(memoryview(rng.integers(0, 1 << 30, n // 4, dtype=np.int32)))
    return parts


def _expected(parts: list[bytes | bytearray | memoryview]) -> tuple[bytes, str, tuple[str, ...]]:
    joined = b"".join(memoryview(p).cast("B") for p in parts)
    pieces = PieceHasher(1 << 20)
    pieces.update(joined)
    return joined, hashlib.sha256(joined).hexdigest(), pieces.result().digests


def test_write_parts_to_a_file_is_the_parts_joined(tmp_path: Path) -> None:
    parts = _parts()
    joined, sha, digests = _expected(parts)
    path = tmp_path / "out"
    digest = Digest("sha256", 1 << 20)
    with open(path, "wb", buffering=0) as f:
        w = HashingWriter(f, digest)
        w.write(b"head")
        w.write_parts(parts)
    assert path.read_bytes() == b"head" + joined
    head_and = hashlib.sha256(b"head" + joined).hexdigest()
    assert digest.hasher.hexdigest() == head_and and digest.size == 4 + len(joined)
    alone = Digest("sha256", 1 << 20)
    with open(tmp_path / "alone", "wb", buffering=0) as f:
        HashingWriter(f, alone).write_parts(parts)
    assert alone.hasher.hexdigest() == sha
    assert alone.pieces is not None and alone.pieces.result().digests == digests


def test_write_parts_to_a_sink_without_a_descriptor() -> None:
    parts = _parts()[:200]
    joined, sha, _ = _expected(parts)
    sink = io.BytesIO()
    digest = Digest("sha256")
    HashingWriter(sink, digest).write_parts(parts)  # type: ignore[arg-type]
    assert sink.getvalue() == joined and digest.hasher.hexdigest() == sha


def test_empty_parts_write_nothing(tmp_path: Path) -> None:
    digest = Digest("sha256")
    with open(tmp_path / "out", "wb", buffering=0) as f:
        w = HashingWriter(f, digest)
        w.write_parts([b"", bytearray(), memoryview(b"")])
        w.write_parts([b"x" * 600_000, b""])
    assert (tmp_path / "out").read_bytes() == b"x" * 600_000
    assert digest.hasher.hexdigest() == hashlib.sha256(b"x" * 600_000).hexdigest()
