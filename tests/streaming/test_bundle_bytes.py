"""How many batches a worker process's bundle may hold: guessed from the manifest only up to
a few (a decoded batch may be many times its bytes in the shards), then from the bytes the
batches of an epoch really held, so the bundles in flight stay near BUNDLE_BYTES."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit import ShardDataset, ShardWriter, WebLoader
from shardkit.streaming.bundles import (
    BUNDLE_BYTES,
    BUNDLE_GUESSED,
    BUNDLE_MAX,
    batch_bytes,
    bundle_cap,
)
from shardkit.streaming.transfer import PackedBytes


def test_a_guess_is_capped_and_what_was_seen_decides() -> None:
    assert bundle_cap(None, 8) == 2
    assert bundle_cap(100.0, 8) == BUNDLE_GUESSED  # tiny in the shards: still a guess
    assert bundle_cap(100.0, 8, seen=100.0) == BUNDLE_MAX
    assert bundle_cap(100.0, 8, seen=BUNDLE_BYTES / 8 / 3) == 3
    assert bundle_cap(100.0, 8, seen=float(BUNDLE_BYTES)) == 1


def test_a_batch_s_bytes_count_arrays_tensors_bytes_and_packed_bytes() -> None:
    import torch

    batch: Any = {
        "k": ["ab", "c"],
        "t": [torch.zeros(10, dtype=torch.int32), np.zeros(3, np.int64)],
        "b": (b"xyz", PackedBytes([b"12", b"345"], [0, 2, 5])),
        "n": 7,
    }
    assert batch_bytes(batch) == 3 + 40 + 24 + 3 + 5


@pytest.mark.integration
@pytest.mark.parametrize("grow", [1 << 20, 0])
def test_the_next_epoch_sizes_bundles_by_the_batches_seen(tmp_path: Path, grow: int) -> None:
    """Samples of ~2 KB in the shards that a map makes 1 MiB (as a decoder turns JPEG into
    pixels): the first epoch's bundles hold at most BUNDLE_GUESSED batches, the next ones
    what fits BUNDLE_BYTES over the bundles in flight (3 of 1 MiB and a key); small batches
    (no growth) get the largest bundles once seen. Every sample arrives, each epoch."""
    with ShardWriter(tmp_path, maxsize="20KB") as w:
        for i in range(24):
            w.write({"__key__": f"s{i:03d}", "bin": bytes([i]) * 2000})

    def big(s: tuple[str, bytes]) -> tuple[str, np.ndarray]:
        return s[0], np.full(max(grow, 1), s[1][0], np.uint8)

    ds = ShardDataset(tmp_path / "manifest.json").to_tuple("__key__", "bin").map(big).batched(1)
    loader = WebLoader(ds, num_workers=2, prefetch_factor=2)
    caps = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        keys = [k for b in loader for k in b[0]]
        assert sorted(keys) == [f"s{i:03d}" for i in range(24)]
        caps.append(loader._mailbox.read()["bundle"])
    in_flight = 2 * (2 + 2)
    assert caps[0] <= BUNDLE_GUESSED
    want = int(BUNDLE_BYTES / in_flight // (grow + 4)) if grow else BUNDLE_MAX  # + the key
    assert want == (3 if grow else BUNDLE_MAX)
    assert caps[1] == want
