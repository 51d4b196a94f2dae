"""A sample index is believed only as far as a read proves it: bound to its shard, each
offset bound to the sample found there (key and fields). Through ShardDataset + WebLoader
with workers (ranks reading parts of shards, so by index seeks) and verify --deep."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit import ShardDataset, ShardFormatError, WebLoader
from shardkit.cache import make_opener
from shardkit.check.verify import verify
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import (
    index_entry_range,
    parse_index,
    sample_signature,
    write_index,
)
from shardkit.io import load_manifest
from tests.helpers.data import make_shards
from tests.helpers.indexes import put_index

pytestmark = pytest.mark.integration

WORLD = 3  # 2 shards of 6 samples over 3 ranks: every rank starts or ends inside a shard


def _read_every_rank(manifest: Path, workers: int = 2) -> list[str]:
    keys: list[str] = []
    for rank in range(WORLD):
        ds = ShardDataset(str(manifest), shardshuffle=False).split_by_node(rank, WORLD)
        ctx = "fork" if workers else None
        loader = WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)
        keys += [s["__key__"] for s in loader]
    return keys


def _set(tmp_path: Path) -> tuple[Path, Manifest]:
    m = make_shards(tmp_path / "set", [6, 6])
    return tmp_path / "set" / "manifest.json", m


@pytest.mark.timeout(120)
def test_good_indexes_read_every_sample_once(tmp_path: Path) -> None:
    manifest, _ = _set(tmp_path)
    keys = _read_every_rank(manifest)
    assert sorted(keys) == [f"sample-{i:08d}" for i in range(12)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("with_checksum", [True, False], ids=["index_checksum", "ranged"])
def test_index_of_another_shard_is_refused(tmp_path: Path, with_checksum: bool) -> None:
    manifest, m = _set(tmp_path)
    other = (manifest.parent / str(m.shards[1].index)).read_bytes()
    mine = (manifest.parent / str(m.shards[0].index)).read_bytes()
    assert parse_index(other).offsets.tolist() == parse_index(mine).offsets.tolist()
    put_index(manifest, 0, other, with_checksum=with_checksum)  # same offsets, other shard
    with pytest.raises(ShardFormatError, match="belongs to another shard"):
        _read_every_rank(manifest)
    report = verify(load_manifest(str(manifest)), level="deep", opener=make_opener())
    assert [(p.kind, p.message) for p in report.problems] == [
        ("index", "sample index belongs to another shard")
    ]


def _forged(m: Manifest, base: Path, i: int, shift_to: str) -> bytes:
    """Shard ``i``'s own index (bound to it) with sample 2's offset moved to the start of
    its ``shift_to`` member: a real header, inside the sample."""
    idx = parse_index((base / str(m.shards[i].index)).read_bytes())
    assert idx.signatures is not None
    offsets = idx.offsets.tolist()
    offsets[2] += {"tokens.npy": 512 + 512}[shift_to]  # json member: header + one block
    return write_index(
        offsets[:-1],
        offsets[-1],
        signatures=idx.signatures.tolist(),
        shard_checksum=m.shards[i].checksum,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("with_checksum", [True, False], ids=["index_checksum", "ranged"])
def test_offset_inside_a_sample_is_refused(tmp_path: Path, with_checksum: bool) -> None:
    manifest, m = _set(tmp_path)
    forged = _forged(m, manifest.parent, 0, "tokens.npy")
    put_index(manifest, 0, forged, with_checksum=with_checksum)
    with pytest.raises(ShardFormatError, match=r"sends sample|hold more samples") as info:
        _read_every_rank(manifest)
    assert m.shards[0].url in str(info.value)
    report = verify(load_manifest(str(manifest)), level="deep", opener=make_opener())
    assert [p.kind for p in report.problems] == ["index"]
    assert "the offset of sample 2 differs" in report.problems[0].message


@pytest.mark.timeout(60)
def test_index_signatures_are_the_samples_key_and_fields(tmp_path: Path) -> None:
    manifest, m = _set(tmp_path)
    idx = parse_index((manifest.parent / str(m.shards[1].index)).read_bytes())
    assert idx.version == 3 and idx.signatures is not None
    want = [sample_signature(f"sample-{i:08d}", ["json", "tokens.npy"]) for i in range(6, 12)]
    assert idx.signatures.tolist() == want
    assert index_entry_range(0, version=2)[0] == 48


@pytest.mark.timeout(120)
@pytest.mark.parametrize("with_checksum", [True, False], ids=["index_checksum", "ranged"])
def test_a_version_1_index_still_reads(
    tmp_path: Path, with_checksum: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Indexes written before version 2 are read (counts checked, a warning): unbound."""
    manifest, m = _set(tmp_path)
    for i in (0, 1):
        offsets = parse_index((manifest.parent / str(m.shards[i].index)).read_bytes()).offsets
        put_index(
            manifest, i, write_index(offsets[:-1].tolist(), int(offsets[-1])),
            with_checksum=with_checksum,
        )  # fmt: skip
    with caplog.at_level("WARNING", logger="shardkit"):
        keys = _read_every_rank(manifest, workers=0)
    assert sorted(keys) == [f"sample-{i:08d}" for i in range(12)]
    assert "version 1 sample index" in caplog.text
    assert verify(load_manifest(str(manifest)), level="deep", opener=make_opener()).ok
