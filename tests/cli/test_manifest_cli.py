"""``shardkit manifest from-shards | merge | to-csv`` on real shards, some written by webdataset."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import tarfile
import warnings
from pathlib import Path

import pytest
import webdataset as wds

from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.format.tario.reader import read_shard
from tests.helpers.data import make_shards
from tests.helpers.readback import shardkit, write_jsonl

pytestmark = pytest.mark.integration


def _webdataset_shards(out: Path, n: int = 230, maxcount: int = 100) -> list[Path]:
    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "wds-%04d.tar"), maxcount=maxcount, verbose=0) as w:
        for i in range(n):
            sample = {"__key__": f"s{i:05d}", "txt": "x" * (i % 700), "cls": i}
            if i % 3 == 0:
                sample["json"] = {"i": i}
            w.write(sample)
    return sorted(out.glob("*.tar"))


def _first_member_offsets(path: Path) -> tuple[list[str], list[int]]:
    """Keys and sample start offsets as Python's tarfile sees them (pax headers included)."""
    keys: list[str] = []
    offsets: list[int] = []
    with tarfile.open(path) as t:
        for m in t.getmembers():
            key = m.name.split(".", 1)[0]
            if not keys or keys[-1] != key:
                keys.append(key)
                offsets.append(m.offset)
    return keys, offsets


def test_from_shards_on_webdataset_shards(tmp_path: Path) -> None:
    paths = _webdataset_shards(tmp_path / "wds")
    r = shardkit("manifest", "from-shards", tmp_path / "wds", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 230
    m = Manifest.load(tmp_path / "wds" / "manifest.json")
    assert [s.url for s in m] == [p.name for p in paths]
    for s, p in zip(m.shards, paths, strict=True):
        keys, offsets = _first_member_offsets(p)
        assert s.size == p.stat().st_size
        assert s.checksum == "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
        assert s.nsamples == len(keys)
        index = read_index((p.parent / (s.index or "")).read_bytes())
        assert index[:-1].tolist() == offsets
        # the index seeks straight to any sample
        i = len(keys) // 2
        got = next(iter(read_shard(p, start=int(index[i]), end=int(index[i + 1]))))
        assert got["__key__"] == keys[i]
    assert m.fields["txt"]["count"] == 230 and m.fields["json"]["count"] == 77
    verify = shardkit("verify", tmp_path / "wds" / "manifest.json", "--deep")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # the same shards read through webdataset and through the new manifest agree
    ours = [s["__key__"] for s in m.shards for s in read_shard(tmp_path / "wds" / s.url)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset 1.0 leaves a file open
        theirs = [s["__key__"] for s in wds.WebDataset([str(p) for p in paths], shardshuffle=False)]
        gc.collect()
    assert ours == theirs


def test_from_shards_pattern_no_index_and_zstd(tmp_path: Path) -> None:
    made = make_shards(tmp_path / "z", [3, 4], compress="zstd", checksum="xxh3_128")
    os.remove(tmp_path / "z" / "manifest.json")
    for s in made.shards:
        os.remove(tmp_path / "z" / (s.index or ""))
    pattern = tmp_path / "z" / "data-{000000..000001}.tar.zst"
    out = tmp_path / "z" / "again.json"
    r = shardkit(
        "manifest", "from-shards", pattern, "-o", out, "--checksum", "xxh3_128", "--no-index"
    )
    assert r.returncode == 0, r.stderr
    again = Manifest.load(out)
    assert [(s.url, s.size, s.nsamples, s.checksum, s.index) for s in again] == [
        (s.url, s.size, s.nsamples, s.checksum, None) for s in made
    ]
    assert not list((tmp_path / "z").rglob("*.idx"))
    elsewhere = shardkit("manifest", "from-shards", pattern, "-o", tmp_path / "sub" / "m.json")
    assert elsewhere.returncode == 1 and "outside" in elsewhere.stderr
    nothing = shardkit("manifest", "from-shards", tmp_path / "z" / "none-*.tar")
    assert nothing.returncode == 2 and "matches nothing" in nothing.stderr


def test_from_shards_names_a_broken_shard(tmp_path: Path) -> None:
    paths = _webdataset_shards(tmp_path / "wds", n=20, maxcount=10)
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) // 2 + 100])
    r = shardkit("manifest", "from-shards", tmp_path / "wds")
    assert r.returncode == 1
    assert "wds-0001.tar" in r.stderr and "truncated" in r.stderr
    assert not (tmp_path / "wds" / "manifest.json").exists()


def test_to_csv(tmp_path: Path) -> None:
    m = make_shards(tmp_path / "s", [2, 5])
    path = tmp_path / "s" / "manifest.json"
    os.remove(tmp_path / "s" / "manifest.csv")
    out = shardkit("manifest", "to-csv", path, "-o", "-")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == "url,size,nsamples,checksum"
    assert out.stdout == m.to_csv()
    wrote = shardkit("manifest", "to-csv", path)
    assert wrote.returncode == 0
    back = Manifest.load(tmp_path / "s" / "manifest.csv")
    assert [s.checksum for s in back] == [s.checksum for s in m]


def test_merge_refuses_missing_and_unfinished_parts(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    for f in range(4):
        write_jsonl(src / f"f{f}.jsonl", [{"f": f, "i": i} for i in range(20)])
    out = tmp_path / "out"
    for i in range(3):
        assert (
            shardkit("build", src, "-o", out, "--part", f"{i}/3", "--maxcount", "15").returncode
            == 0
        )
    parts = sorted(out.glob("manifest.part-*.json"))
    missing = shardkit("manifest", "merge", parts[0], parts[2], "-o", out / "manifest.json")
    assert missing.returncode == 1 and "part 1 missing" in missing.stderr
    partial = shardkit(
        "manifest", "merge", parts[0], parts[2], "-o", out / "partial.json", "--allow-incomplete"
    )
    assert partial.returncode == 0, partial.stderr
    assert Manifest.load(out / "partial.json").created["incomplete"] == "2 of 3 parts"
    doc = json.loads(parts[1].read_text())
    doc["created"]["build"]["complete"] = False
    parts[1].write_text(json.dumps(doc))
    unfinished = shardkit("manifest", "merge", *parts, "-o", out / "manifest.json")
    assert unfinished.returncode == 1 and "did not finish" in unfinished.stderr
    assert not (out / "manifest.json").exists()


def test_from_shards_lists_the_piece_checksums_the_writer_wrote(tmp_path: Path) -> None:
    import xxhash

    m = make_shards(tmp_path / "ds", [30, 7], tokens=700, piece_size="8KB", compress="zstd")
    m2 = make_shards(tmp_path / "plain", [30, 7], tokens=700, piece_size="8KB")
    for written, d in ((m, "ds"), (m2, "plain")):
        out = tmp_path / d / "scan.json"
        r = shardkit("manifest", "from-shards", tmp_path / d, "-o", out, "--piece-size", "8KB")
        assert r.returncode == 0, r.stderr
        scanned = Manifest.load(out)
        assert [s.pieces for s in scanned] == [s.pieces for s in written]
        for s in scanned:
            data = (tmp_path / d / s.url).read_bytes()
            assert s.pieces is not None and s.pieces.size == 8000
            assert list(s.pieces.digests) == [
                xxhash.xxh3_128(data[i : i + 8000]).hexdigest() for i in range(0, len(data), 8000)
            ]
    r = shardkit("manifest", "from-shards", tmp_path / "plain", "-o", tmp_path / "plain" / "n.json",
                 "--piece-size", "0")  # fmt: skip
    assert r.returncode == 0 and all(
        s.pieces is None for s in Manifest.load(tmp_path / "plain" / "n.json")
    )
