"""A verified read by sample digests hands out the bytes an unverified read does, on
shardkit's shards and on foreign ones (Python's tarfile with a pax header per member, as
webdataset writes; tarfile's GNU format with long-name headers; GNU tar), and refuses a
changed byte: the read that hashes each read in place and counts its own bytes (no
counting wrapper) and reads a large member once (``read_once``, nothing kept for a step
back) is held to ``read_shard`` and to tarfile's own reading of the same files."""

from __future__ import annotations

import io
import itertools
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from shardkit import ChecksumError, ShardDataset, read_shard
from shardkit.cache import opener_for
from shardkit.check.summary import manifest_from_shards
from shardkit.format.layout import index_name
from shardkit.format.manifest.compact import save_manifest
from shardkit.format.tario.index import parse_index, sample_digest
from shardkit.io.config import IoConfig
from shardkit.io.verified_samples import SampleVerified
from shardkit.read.catalog import open_catalog
from shardkit.read.stream import read_stream

N = 6


def _members(i: int) -> list[tuple[str, bytes]]:
    """Sample ``i``: a small json, a member read into its own object (>= 64 KiB) for
    even ``i``, and a small text after it; keys long enough for a GNU long name on one."""
    key = f"k{i:03d}" if i != 3 else "long/" + "x" * 110 + "3"
    big = bytes((i * 7 + j) % 251 for j in range(70_000 + 1000 * i)) if i % 2 == 0 else b"s" * 900
    return [(f"{key}.json", b'{"i": %d}' % i), (f"{key}.bin", big), (f"{key}.txt", b"t" * i)]


def _tarfile_shard(path: Path, fmt: int) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for i in range(N):
            for name, data in _members(i):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 1_700_000_000.5  # a float: a pax header per member (pax format)
                tf.addfile(info, io.BytesIO(data))


def _gnu_tar_shard(path: Path) -> None:
    tar = shutil.which("tar")
    assert tar is not None, "GNU tar is part of the test environment"
    src = path.parent / "src"
    names = []
    for i in range(N):
        for name, data in _members(i):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(data)
            names.append(name)
    subprocess.run([tar, "--format=gnu", "-cf", str(path), "-C", str(src), *names], check=True)
    shutil.rmtree(src)


def _tarfile_samples(path: Path) -> list[dict[str, Any]]:
    """The samples as tarfile reads them (the reference none of shardkit's code makes)."""
    out: list[dict[str, Any]] = []
    with tarfile.open(path) as tf:
        for m in tf:
            f = tf.extractfile(m)
            assert f is not None
            base = m.name.rsplit("/", 1)[-1]
            key = m.name[: len(m.name) - len(base) + base.index(".")]
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            out[-1][base[base.index(".") + 1 :]] = f.read()
    return out


@pytest.fixture(params=["pax", "gnu-long-names", "gnu-tar"])
def foreign(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """A foreign shard, its manifest and version 3 index as `manifest from-shards` makes
    them (so a verified read checks each sample by the index's digests)."""
    shard = tmp_path / "set" / "f-000000.tar"
    shard.parent.mkdir()
    if request.param == "gnu-tar":
        _gnu_tar_shard(shard)
    else:
        _tarfile_shard(shard, tarfile.PAX_FORMAT if request.param == "pax" else tarfile.GNU_FORMAT)
    m, path = manifest_from_shards(str(shard.parent))
    save_manifest(m, path)
    assert parse_index((shard.parent / index_name(shard.name)).read_bytes()).version == 3
    return shard, Path(path)


def _plain(samples: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


def test_a_verified_read_of_foreign_shards_is_the_unverified_one_and_refuses_a_changed_byte(
    foreign: tuple[Path, Path],
) -> None:
    shard, manifest = foreign
    want = _tarfile_samples(shard)
    assert len(want) == N and _plain(read_shard(shard)) == want
    assert _plain(ShardDataset(str(manifest), shardshuffle=False)) == want
    offsets = parse_index((shard.parent / index_name(shard.name)).read_bytes()).offsets
    data = bytearray(shard.read_bytes())
    data[int(offsets[4]) + 3000 + 3 * 1024] ^= 0x01  # inside sample 4's large member's data
    shard.write_bytes(bytes(data))
    keys: list[str] = []
    with pytest.raises(ChecksumError, match=r"sample 4 .*differs from its digest") as info:
        for s in ShardDataset(str(manifest), shardshuffle=False):
            keys.append(str(s["__key__"]))
    assert keys == [s["__key__"] for s in want[: len(keys)]] and len(keys) <= 4
    assert info.value.url == str(shard) and info.value.offset == int(offsets[4])


def test_a_verified_read_counts_the_bytes_it_hands_out(make_shards: Any) -> None:
    m = make_shards([5], tokens=20_000)  # 80 KB members: each read into its own object
    manifest = Path(str(m.base)) / "manifest.json"
    shard = Path(str(m.base)) / m.shards[0].url
    cfg = IoConfig()
    opener = opener_for(cfg)
    catalog = open_catalog(str(manifest), opener, io=cfg)
    counts = {"samples": 0.0, "bytes": 0.0}
    rows = iter([(0, 0, 5, 0)])
    got = [s for _, s in read_stream(rows, catalog, opener, counts, "raise", cfg.limits)]
    assert _plain(got) == list(read_shard(shard))
    size = shard.stat().st_size
    # every byte of the shard up to its end-of-archive marker, counted once (the head the
    # compression sniff reads and steps back over counts twice: as a counting wrapper did)
    assert size - 10240 <= counts["bytes"] <= size + 1024 and counts["read_s"] > 0


def test_bytes_read_again_before_a_large_member_must_be_the_ones_checked(
    tmp_path: Path,
) -> None:
    data = os.urandom(200_000)
    path = tmp_path / "s.bin"
    path.write_bytes(data)
    bounds = [0, 100_000, 200_000]
    digests = [sample_digest(data[a:b]) for a, b in itertools.pairwise(bounds)]
    f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed with the stream
    with SampleVerified(f, url=str(path), bounds=bounds, digests=digests) as s:  # type: ignore[arg-type]
        assert s.read(8192) == data[:8192]
        s.seek(4096)  # the tar reader's step back before a member read into its own object
        assert s.read_once(90_000) == data[4096:94_096]
        with pytest.raises(OSError, match="steps back"):
            s.seek(90_000)  # nothing before a read_once is kept to check again
        assert s.read(6000) == data[94_096:100_096] and s.verified_to == 100_000
        with open(path, "r+b") as g:  # rewritten under the reader
            g.seek(99_000)
            g.write(b"\0" * 10)
        s.seek(96_000)
        with pytest.raises(ChecksumError, match="changed while they were read"):
            s.read_once(50_000)
