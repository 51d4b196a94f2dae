"""The manifest's compact columnar form: equal to manifest.json, and never used when it
does not fit (stale, foreign, damaged)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from shardkit.cache import make_opener
from shardkit.errors import ManifestError
from shardkit.format.manifest.compact import (
    build_compact,
    compact_path,
    load_compact,
    save_manifest,
)
from shardkit.format.manifest.compact_file import PRELUDE
from shardkit.format.manifest.compact_pieces import BLOCK_ROWS
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.pieces import Pieces
from shardkit.read.catalog import Catalog, open_catalog
from shardkit.read.shards import CompactShards, load_catalog
from shardkit.write.writer import ShardWriter
from tests.helpers.strategies import manifests


def _catalogs(path: str) -> tuple[Catalog, Catalog]:
    opener = make_opener()
    compact = open_catalog(path, opener)
    assert isinstance(compact.shards, CompactShards)
    return compact, Catalog(load_catalog(path, opener))


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifests())
def test_the_compact_form_equals_manifest_json(tmp_path: Path, m: Manifest) -> None:
    d = tmp_path / f"m{os.urandom(4).hex()}"
    d.mkdir()
    path = str(d / "manifest.json")
    m.save(path, csv_too=False)
    compact, parsed = _catalogs(path)
    assert list(compact.shards) == list(parsed.shards)
    assert compact.counts.tolist() == parsed.counts.tolist()
    assert (compact.total, compact.digest) == (parsed.total, parsed.digest)
    form = load_compact(compact_path(path), path)
    back = Manifest.load(path)
    assert form.header["total_bytes"] == back.total_bytes
    assert form.header["fields"] == back.fields
    assert [form.urls[i] for i in range(len(back))] == [e.url for e in back]
    again = pickle.loads(pickle.dumps(compact))
    assert isinstance(again.shards, CompactShards)
    assert list(again.shards) == list(parsed.shards) and again.digest == parsed.digest


def test_a_pattern_of_urls_is_stored_as_a_pattern(tmp_path: Path) -> None:
    entries = [ShardEntry(f"data-{i:06d}.tar", 10, 1, "sha256:" + "ab" * 32) for i in range(5)]
    path = str(tmp_path / "manifest.json")
    Manifest(shards=entries).save(path)
    form = load_compact(build_compact(path), path)
    assert form.urls.kind == "pattern" and form.checksums.kind == "hex"
    assert form.urls[4] == "data-000004.tar"


def test_a_stale_foreign_or_damaged_form_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    def manifest(d: str, counts: list[int]) -> str:
        entries = [
            ShardEntry(f"{d}-{i:06d}.tar", 100 + i, n, "sha256:" + f"{i:02x}" * 32)
            for i, n in enumerate(counts)
        ]
        os.makedirs(tmp_path / d, exist_ok=True)
        path = str(tmp_path / d / "manifest.json")
        Manifest(shards=entries).save(path)
        return path

    a = manifest("a", [3, 4, 5])
    b = manifest("b", [7, 7])
    opener = make_opener()
    assert open_catalog(a, opener).total == 12
    # stale: the manifest changed after its form was built
    a = manifest("a", [3, 4, 6])
    with pytest.raises(ManifestError, match="stale"):
        load_compact(compact_path(a), a)
    assert open_catalog(a, opener).total == 13
    # foreign: another data set's form copied beside this manifest
    open_catalog(b, opener)
    shutil.copy(compact_path(b), compact_path(a))
    with pytest.raises(ManifestError, match="stale"):
        load_compact(compact_path(a), a)
    assert open_catalog(a, opener).counts.tolist() == [3, 4, 6]
    # damaged: one byte of the arrays changed
    raw = bytearray(Path(compact_path(a)).read_bytes())
    raw[-70] ^= 0xFF
    Path(compact_path(a)).write_bytes(bytes(raw))
    with pytest.raises(ManifestError, match="checksum"):
        load_compact(compact_path(a), a)
    assert open_catalog(a, opener).counts.tolist() == [3, 4, 6]
    # not a form at all
    Path(compact_path(a)).write_bytes(b"hello")
    with pytest.raises(ManifestError, match=r"truncated|not a shardkit"):
        load_compact(compact_path(a), a)
    assert open_catalog(a, opener).counts.tolist() == [3, 4, 6]
    assert np.array_equal(open_catalog(a, opener).counts, [3, 4, 6])


def test_a_url_out_of_the_base_is_refused_as_by_the_parse(tmp_path: Path) -> None:
    entries = [ShardEntry("../elsewhere/data-000000.tar", 10, 1, "sha256:" + "ab" * 32)]
    path = str(tmp_path / "manifest.json")
    Manifest(shards=entries).save(path)
    with pytest.raises(ManifestError, match="elsewhere"):
        open_catalog(path, make_opener())
    unsafe = open_catalog(path, make_opener(), allow_unsafe_urls=True)
    assert isinstance(unsafe.shards, CompactShards)
    assert unsafe.shards[0].ref.url == os.path.normpath(
        str(tmp_path / "../elsewhere/data-000000.tar")
    )


def _with_pieces(n: int, per: int) -> Manifest:
    entries = [
        ShardEntry(
            f"data-{i:06d}.tar",
            100 * per,
            1,
            "sha256:" + f"{i % 256:02x}" * 32,
            pieces=Pieces(100, tuple(f"{(i * per + k) % 2**64:032x}" for k in range(per))),
        )
        for i in range(n)
    ]
    return Manifest(shards=entries)


def test_the_build_writes_the_form_so_the_first_reader_parses_no_json(tmp_path: Path) -> None:
    path = str(tmp_path / "manifest.json")
    save_manifest(_with_pieces(3, 2), path)
    before = os.stat(compact_path(path))
    catalog = open_catalog(path, make_opener())
    assert isinstance(catalog.shards, CompactShards)
    assert os.stat(compact_path(path)).st_ino == before.st_ino  # mapped, not built again
    assert [s.ref.pieces for s in catalog.shards] == [e.pieces for e in Manifest.load(path)]
    # a manifest written again without its form: the old form is stale, built again
    _with_pieces(4, 1).save(path)
    catalog = open_catalog(path, make_opener())
    assert [s.ref.pieces for s in catalog.shards] == [e.pieces for e in Manifest.load(path)]


def test_the_writer_leaves_a_form_that_fits(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, maxcount=2, piece_size=4096) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "bin": os.urandom(5000)})
    path = str(tmp_path / "manifest.json")
    form = load_compact(compact_path(path), path)
    assert [form.pieces[i] for i in range(len(form))] == [e.pieces for e in Manifest.load(path)]


def test_damaged_piece_checksums_are_found_when_read(tmp_path: Path) -> None:
    path = str(tmp_path / "manifest.json")
    save_manifest(_with_pieces(3, BLOCK_ROWS // 2), path)  # shard 2 lies in block 1
    form = load_compact(compact_path(path), path)
    offset = form.header["arrays"]["pieces.digests"][0]
    raw = bytearray(Path(compact_path(path)).read_bytes())
    start = PRELUDE + int.from_bytes(raw[8:16], "little")  # magic, lengths, checksum, header
    del form
    raw[start + offset + 16 * (BLOCK_ROWS + 1)] ^= 0xFF  # a digest of shard 2
    Path(compact_path(path)).write_bytes(bytes(raw))
    catalog = open_catalog(path, make_opener())  # the open does not read the digests
    assert catalog.shards[0].ref.pieces == Manifest.load(path).shards[0].pieces
    with pytest.raises(ManifestError, match="piece checksums"):
        catalog.shards[2]
