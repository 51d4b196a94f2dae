"""How many batches a worker process's bundle may hold: guessed from the manifest only up to
a few (a decoded batch may be many times its bytes in the shards), then from the bytes the
first batches really held (published mid-epoch), so the bundles in flight stay near
BUNDLE_BYTES."""

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
    Unbundled,
    batch_bytes,
    bundle_cap,
    bundles,
)
from shardkit.streaming.shared import CapBoard
from shardkit.streaming.transfer import PackedBytes


def test_a_published_cap_rules_the_bundles_from_its_index_on() -> None:
    """Before a cap is published bundles follow 1, 2, 4 up to the epoch's; from the
    published index on they grow (or shrink) to the published cap."""
    board = CapBoard()

    def sizes(n: int, cap: int) -> list[int]:
        return [len(b.batches) for b in bundles(((i, None) for i in range(n)), cap, 0, board)]

    assert sizes(40, 4) == [1, 2, *[4] * 9, 1]
    board.publish(4, 16)
    assert sizes(60, 4) == [1, 2, 4, 4, 8, 16, 16, 9]
    board.publish(3, 1)
    assert sizes(12, 4) == [1, 2, 4, 1, 1, 1, 1, 1]
    board.clear()
    assert sizes(7, 4) == [1, 2, 4]


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
def test_bundles_are_sized_by_the_batches_seen_in_the_first_epoch_too(
    tmp_path: Path, grow: int
) -> None:
    """Samples of ~2 KB in the shards that a map makes 1 MiB (as a decoder turns JPEG into
    pixels): after each worker's first bundle the training process publishes the cap that
    fits BUNDLE_BYTES over the bundles in flight (3 of 1 MiB and a key), so the first epoch
    already ends with bundles of 3; small batches (no growth) get bundles of 16. The next
    epoch starts from what was seen. The batches are thread workers', in their order."""
    with ShardWriter(tmp_path, maxsize="40KB") as w:
        for i in range(160):
            w.write({"__key__": f"s{i:03d}", "bin": bytes([i]) * 2000})

    def big(s: tuple[str, bytes]) -> tuple[str, np.ndarray]:
        return s[0], np.full(max(grow, 1), s[1][0], np.uint8)

    def loader(mode: str) -> WebLoader:
        ds = ShardDataset(tmp_path / "manifest.json").to_tuple("__key__", "bin")
        return WebLoader(ds.map(big).batched(1), num_workers=2, worker_mode=mode)

    threads, ld = loader("thread"), loader("process")
    sizes: list[int] = []
    real = Unbundled._pull

    def spy(self: Unbundled, w: int) -> bool:
        before = len(self.queues[w])
        got = real(self, w)
        sizes.append(len(self.queues[w]) - before)
        return got

    Unbundled._pull = spy  # type: ignore[method-assign]
    try:
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            threads.set_epoch(epoch)
            want = [list(b[0]) for b in threads]
            sizes.clear()
            assert [list(b[0]) for b in ld] == want
            in_flight = 2 * (2 + 2)
            cap = int(BUNDLE_BYTES / in_flight // (grow + 4)) if grow else BUNDLE_MAX
            assert cap == (3 if grow else BUNDLE_MAX)
            if epoch == 0:
                assert max(sizes) <= max(cap, BUNDLE_GUESSED) and cap in sizes
            else:
                assert ld._mailbox.read()["bundle"] == cap and max(sizes) <= cap
    finally:
        Unbundled._pull = real  # type: ignore[method-assign]
