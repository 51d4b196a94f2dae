"""Hostile pass on issue 30's random access (99fc610: a process keeps open shard files and
checked pieces, parses the one sample from the index's bytes): a rebuild between lookups,
keys that differ by case or unicode normalisation, a fork after lookups (threads:
tests/read's lock test, 6b490bd)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import torch

from shardkit import IndexedShards
from shardkit.errors import ShardkitError
from shardkit.write.writer import ShardWriter
from tests.helpers.data import unsynced


def _write(out: Path, samples: list[dict[str, object]], **kwargs: object) -> None:
    with unsynced(), ShardWriter(out, prefix="d", **kwargs) as w:  # type: ignore[arg-type]
        for s in samples:
            w.write(s)


def _blobs(n: int, size: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]


def test_keys_differing_by_case_or_normalisation_are_distinct(tmp_path: Path) -> None:
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    keys = ["A", "a", nfc, nfd, "ß", "SS", "k\u200b", "k"]
    _write(
        tmp_path,
        [{"__key__": k, "txt": f"v{i}"} for i, k in enumerate(keys)],
        maxcount=3,
        piece_size=4096,
    )
    ds = IndexedShards(tmp_path)
    for i, k in enumerate(keys):
        assert ds.get(k)["txt"] == f"v{i}".encode()
        assert ds.index_of(k) == i
    for k in ("ss", "CAFÉ", "K", "k\u200c"):
        assert ds.get(k, None) is None


def test_a_rebuild_between_lookups_gives_the_opened_set_or_an_error(tmp_path: Path) -> None:
    old, new = _blobs(12, 3000, 0), _blobs(12, 3000, 1)  # same sizes, other bytes
    _write(tmp_path, [{"__key__": f"k{i:03d}", "bin": b} for i, b in enumerate(old)], maxcount=4)
    ds = IndexedShards(tmp_path)
    assert bytes(ds[0]["bin"]) == old[0]  # shard 0 is open now, the others not yet
    _write(
        tmp_path,
        [{"__key__": f"k{i:03d}", "bin": b} for i, b in enumerate(new)],
        maxcount=4,
        overwrite=True,
    )
    for i in range(12):
        try:
            got = bytes(ds[i]["bin"])
        except ShardkitError:
            continue  # the set opened is gone: an error is right
        assert got == old[i], f"sample {i} of the rebuilt set under the old manifest"
    fresh = IndexedShards(tmp_path)
    assert [bytes(fresh[i]["bin"]) for i in range(12)] == new


def test_forked_workers_after_lookups_read_every_sample(tmp_path: Path) -> None:
    blobs = _blobs(10, 5000, 2)
    _write(
        tmp_path,
        [{"__key__": f"k{i:03d}", "bin": b} for i, b in enumerate(blobs)],
        maxcount=4,
        piece_size=4096,
    )
    ds = IndexedShards(tmp_path)
    assert [bytes(ds[i]["bin"]) for i in (9, 0, 5)] == [blobs[9], blobs[0], blobs[5]]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    assert [bytes(s["bin"]) for s in loader] == blobs
    assert [bytes(ds[i]["bin"]) for i in range(10)] == blobs  # the parent's kept files
