"""Test data factories: deterministic samples and shard sets the tests make themselves."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardkit.format.manifest.model import Manifest
from shardkit.write.writer import ShardWriter


def make_samples(
    n: int, *, start: int = 0, tokens: int = 64, seed: int = 0
) -> Iterator[dict[str, Any]]:
    """``n`` small LLM-style samples: a json record and an int32 token array."""
    rng = np.random.default_rng(seed)
    for i in range(start, start + n):
        yield {
            "__key__": f"sample-{i:08d}",
            "json": {"id": i, "text": f"document {i}"},
            "tokens.npy": rng.integers(0, 50_000, size=tokens, dtype=np.int32),
        }


def make_shards(
    out_dir: str | os.PathLike[str],
    sizes: Sequence[int],
    *,
    tokens: int = 64,
    prefix: str = "data",
    seed: int = 0,
    **writer_kwargs: Any,
) -> Manifest:
    """Write one shard per entry of ``sizes`` (that many samples each); return the manifest.

    Sample ids run 0..sum(sizes)-1 across the shards, in order.
    """
    samples = make_samples(sum(sizes), tokens=tokens, seed=seed)
    with unsynced(), ShardWriter(out_dir, prefix=prefix, maxsize="2GB", **writer_kwargs) as w:
        for n in sizes:
            for _ in range(n):
                w.write(next(samples))
            w.next_shard()
    return Manifest.load(os.path.join(os.fspath(out_dir), "manifest.json"))


@contextlib.contextmanager
def unsynced() -> Iterator[None]:
    """``os.fsync`` a no-op in this process while the block runs: nothing in a test can
    observe what it buys (that a write survives a power cut; a killed process's writes
    survive without it), and on ext4 each one waits for every dirty page of the file system
    to be written: the writer's four a shard were 85% of making a data set (20 s for 3,000
    shards), and test_compact's 25 examples took 31 s in the whole suite, 0.7 s alone. The
    factories use it, in worker processes too; tests/conftest.py for the whole session."""
    real = os.fsync
    os.fsync = _no_fsync
    try:
        yield
    finally:
        os.fsync = real


def _no_fsync(fd: int) -> None:
    """Check the descriptor as fsync would (a closed one still fails), sync nothing."""
    os.fstat(fd)


def tiny_image(i: int, fmt: str = "PNG") -> bytes:
    """A real 4x4 image (PNG or JPEG), a colour per ``i``: what an image column holds."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (i % 256, (7 * i) % 256, 90)).save(buf, format=fmt)
    return buf.getvalue()
