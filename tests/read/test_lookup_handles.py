"""Lookups: shard files kept open (bounded), checked pieces read once, remote pieces fetched
once, every sample still checked."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cache import opener_for
from shardkit.errors import ChecksumError, ShardFormatError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.io.config import IoConfig, ReaderLimits
from shardkit.io.remote import UncachedOpener
from shardkit.read.catalog import open_catalog
from shardkit.read.lookup import Lookups
from shardkit.read.piece_opener import piece_verified
from tests.helpers.indexes import as_version
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

MakeShards = Callable[..., Manifest]
PIECE = 16 << 10


def _lookups(m: Manifest, io: IoConfig, **kwargs: int) -> Lookups:
    opener = piece_verified(opener_for(io))
    catalog = open_catalog(str(Path(str(m.base)) / "manifest.json"), opener, io=io)
    return Lookups(catalog, opener, io.limits, **kwargs)


def _open_shard_files(base: str) -> int:
    fds = Path("/proc/self/fd")
    names = []
    for fd in fds.iterdir():
        try:
            names.append(os.readlink(fd))
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
    return sum(1 for n in names if n.startswith(base) and n.endswith(".tar"))


@pytest.mark.parametrize("verify", ["on", "off"])
def test_open_shards_are_bounded_and_every_lookup_is_the_sample_read_in_order(
    make_shards: MakeShards, verify: str
) -> None:
    m = make_shards([3, 4, 2, 5, 3], piece_size=PIECE)
    want = read_samples(m)
    lookups = _lookups(m, IoConfig(limits=ReaderLimits(verify=verify)), keep_open=2)
    where = [(s, j) for s, e in enumerate(m.shards) for j in range(e.nsamples)]
    order = list(range(len(where)))
    random.Random(3).shuffle(order)
    counts = {"samples": 0.0, "bytes": 0.0}
    for i in order:
        got = lookups.sample(*where[i], counts)
        assert got == {**want[i], "__url__": got["__url__"]}
        assert lookups.stats()["open_shards"] <= 2
        assert _open_shard_files(str(m.base)) <= 2
    assert counts["bytes"] > 0
    lookups.close()
    assert _open_shard_files(str(m.base)) == 0
    assert lookups.sample(0, 1, counts)["__key__"] == want[1]["__key__"]  # opens again


def test_a_sample_larger_than_a_direct_read_is_read_as_a_stream(make_shards: MakeShards) -> None:
    m = make_shards([3, 4], piece_size=PIECE)
    want = read_samples(m)
    lookups = _lookups(m, IoConfig(), direct_max=100)  # every sample here is larger
    counts = {"samples": 0.0, "bytes": 0.0}
    got = [lookups.sample(s, j, counts) for s, j in [(1, 2), (0, 0), (1, 3)]]
    assert [g["__key__"] for g in got] == [want[i]["__key__"] for i in (5, 0, 6)]
    assert got[0]["tokens.npy"] == want[5]["tokens.npy"]
    assert lookups.stats()["open_shards"] == 0  # none of them read directly


def test_threads_of_one_process_take_turns_at_the_kept_files_and_pieces(
    make_shards: MakeShards,
) -> None:
    m = make_shards([30, 30], tokens=1000, piece_size=PIECE)  # ~4 KB samples, 60 pieces
    want = read_samples(m)
    lookups = _lookups(m, IoConfig(), keep_open=1, keep_bytes=PIECE)  # evicting always
    where = [(s, j) for s, e in enumerate(m.shards) for j in range(e.nsamples)]
    order = [random.Random(t).choices(range(60), k=300) for t in range(4)]

    def look(t: int) -> list[bool]:
        counts = {"samples": 0.0, "bytes": 0.0}
        got = [lookups.sample(*where[i], counts)["tokens.npy"] for i in order[t]]
        return [g == want[i]["tokens.npy"] for g, i in zip(got, order[t], strict=True)]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often, as on a busy machine
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(look, range(4)))
    finally:
        sys.setswitchinterval(old)
    assert all(all(r) for r in results)


def test_a_checked_piece_is_read_once_and_a_damaged_piece_is_never_a_sample(
    make_shards: MakeShards,
) -> None:
    """With an index without per-sample digests (version 2: tests/read/test_sample_digests.py
    has those), a lookup checks the pieces holding its sample."""
    m = make_shards([24], tokens=2000, piece_size=PIECE)  # ~8 KB samples: 2 a piece
    base = Path(str(m.base))
    as_version(base / "manifest.json", 2)
    offsets = read_index((base / index_name(m.shards[0].url)).read_bytes())
    first = next(j for j in range(23) if offsets[j + 1] <= PIECE)  # a sample in piece 0
    far = next(j for j in range(24) if offsets[j] >= 4 * PIECE)  # one well past it
    lookups = _lookups(m, IoConfig())
    counts = {"samples": 0.0, "bytes": 0.0}
    assert lookups.sample(0, first, counts)["__key__"] == f"sample-{first:08d}"
    shard = base / m.shards[0].url
    with open(shard, "r+b") as f:  # one byte changed in piece 0 and one in the far piece
        for at in (int(offsets[first]) + 700, int(offsets[far]) + 700):
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    assert lookups.sample(0, first, counts)["__key__"] == f"sample-{first:08d}"  # kept
    with pytest.raises(ChecksumError, match="piece"):
        lookups.sample(0, far, counts)
    lookups.close()  # the kept pieces go: piece 0 is read, and checked, again
    with pytest.raises(ChecksumError, match="piece 0"):
        lookups.sample(0, first, counts)


@pytest.mark.integration
def test_a_remote_piece_is_fetched_once_for_every_lookup_in_it(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    m = make_shards([24, 4], tokens=500, piece_size=PIECE)  # ~2 KB samples
    offsets = read_index((Path(str(m.base)) / index_name(m.shards[0].url)).read_bytes())
    same = [j for j in range(23) if offsets[j + 1] <= PIECE]  # the samples of piece 0
    assert len(same) >= 2
    with RangeServer(str(m.base)) as srv:
        shard = "/" + m.shards[0].url
        ds = sk.IndexedShards(srv.url("manifest.json"))  # no cache: pieces kept in memory
        keys = [ds[j]["__key__"] for j in same]
        assert keys == [f"sample-{j:08d}" for j in same]
        assert len(srv.requests(shard)) == 1
        cache = str(tmp_path / "cache")
        cached = sk.IndexedShards(srv.url("manifest.json"), cache_dir=cache)
        assert cached[same[0]]["__key__"] == keys[0]
        cached.close()  # its fill of the shard has ended: the node cache holds it
        srv.clear_log()
        again = sk.IndexedShards(srv.url("manifest.json"), cache_dir=cache)
        assert [again[j]["__key__"] for j in same] == keys
        assert srv.requests(shard) == []


def test_an_index_that_sends_a_lookup_to_another_sample_is_refused(
    make_shards: MakeShards,
) -> None:
    m = make_shards([6], piece_size=PIECE)
    base = Path(str(m.base))
    manifest = json.loads((base / "manifest.json").read_text())
    for entry in manifest["shards"]:
        entry.pop("index_checksum", None)  # read by ranged reads, not checked whole
    (base / "manifest.json").write_text(json.dumps(manifest))
    index = base / index_name(m.shards[0].url)
    data = bytearray(index.read_bytes())
    offsets = read_index(bytes(data))
    data[48 + 8 * 3 : 48 + 8 * 4] = int(offsets[2]).to_bytes(8, "little")  # 3 -> sample 2
    index.write_bytes(bytes(data))
    lookups = _lookups(m, IoConfig())
    counts = {"samples": 0.0, "bytes": 0.0}
    assert lookups.sample(0, 4, counts)["__key__"] == "sample-00000004"
    with pytest.raises(ShardFormatError, match="sends sample 3 to sample 'sample-00000002'"):
        lookups.sample(0, 3, counts)


@pytest.mark.integration
def test_a_remote_catalog_opens_on_the_readers_own_client(
    make_shards: MakeShards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = make_shards([4])
    made: list[UncachedOpener] = []
    real = UncachedOpener.__init__

    def counted(self: UncachedOpener, *args: object, **kwargs: object) -> None:
        made.append(self)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(UncachedOpener, "__init__", counted)
    with RangeServer(str(m.base)) as srv:
        for cache in (str(tmp_path / "cache"), None):
            made.clear()
            ds = sk.IndexedShards(srv.url("manifest.json"), cache_dir=cache)
            assert ds[3]["__key__"] == "sample-00000003"
            assert len(made) == 1  # one client (an S3 one takes a second to make)
