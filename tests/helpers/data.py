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
    """``os.fsync`` a no-op while a test makes its input data: a factory's writes need not
    survive a power cut (nothing in a test can observe one), and the writer's four fsyncs a
    shard were 85% of making a data set (3 ms each on ext4: 20 s for 3,000 shards). The code
    under test keeps its fsyncs: only the factories call this."""
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
