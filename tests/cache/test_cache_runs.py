"""A cache fill asks one ranged request per run of consecutive missing pieces, each piece
verified (and visible to readers) the moment its bytes are in."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, opener_for
from shardkit.cache.layout import FillPieces
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

PIECE = 16_000


@pytest.fixture
def shard(make_shards: Callable[..., Manifest]) -> Manifest:
    m = make_shards([10], tokens=3000, subdir="runs", piece_size=PIECE)  # ~139 KB, 9 pieces
    assert m.shards[0].pieces is not None and len(m.shards[0].pieces.digests) == 9
    return m


def ref_of(srv: RangeServer, m: Manifest, cache: Path, **opts: int) -> tuple[object, ObjectRef]:
    range_size = opts.pop("range_size", 64 << 20)
    cfg = IoConfig(range_size=range_size, cache=CacheConfig(cache_dir=cache, **opts))
    opener = opener_for(cfg)
    remote = load_manifest(srv.url("manifest.json"), opener)
    e = remote.shards[0]
    return opener, ObjectRef(remote.resolve(e.url), e.size, e.checksum, e.pieces)


def source(m: Manifest) -> bytes:
    return (Path(str(m.base)) / m.shards[0].url).read_bytes()


def verified(cache: Path, e: ShardEntry) -> list[int]:
    store, key = CacheStore(str(cache)), CacheKey.of(e.checksum, e.size)
    with open(store.part_path(key, FillPieces.of(e.size, e.pieces)), "rb") as f:
        f.seek(e.size)
        return [k for k, b in enumerate(f.read(9)) if b]


@pytest.mark.parametrize(("range_size", "want"), [(64 << 20, 1), (3 * PIECE, 3)])
def test_a_whole_fill_asks_one_request_per_run(
    shard: Manifest, tmp_path: Path, range_size: int, want: int
) -> None:
    with RangeServer(str(shard.base)) as srv:
        opener, ref = ref_of(srv, shard, tmp_path / "c", piece_parallel=1, range_size=range_size)
        assert opener.ensure_cached(ref) == "fetched"  # type: ignore[attr-defined]
        reqs = srv.requests("/data-*")
        with opener.open(ref) as f:  # type: ignore[attr-defined]
            assert f.read() == source(shard)
    assert len(reqs) == want  # 9 pieces: one run, or runs of 3 pieces (range_size)
    assert opener.stats()["pieces_fetched"] == 9  # type: ignore[attr-defined]


def test_a_corrupt_piece_mid_run_is_named_and_the_pieces_before_it_stay(
    shard: Manifest, tmp_path: Path
) -> None:
    e = shard.shards[0]
    with RangeServer(str(shard.base)) as srv:
        srv.add_fault("/data-*", "corrupt", at=5 * PIECE + 11, times=2)  # piece 5, twice
        opener, ref = ref_of(srv, shard, tmp_path / "c", piece_parallel=1)
        with pytest.raises(ChecksumError) as info:
            opener.ensure_cached(ref)  # type: ignore[attr-defined]
        ranges = [r.range for r in srv.requests("/data-*")]
    assert info.value.url == ref.url
    assert f"piece 5 (bytes {5 * PIECE}..{6 * PIECE})" in str(info.value)
    # one run from piece 0, cut at piece 5, then piece 5 alone once more
    assert ranges == [f"bytes=0-{e.size - 1}", f"bytes={5 * PIECE}-{6 * PIECE - 1}"]
    assert opener.stats()["checksum_failures"] == 2  # type: ignore[attr-defined]
    assert verified(tmp_path / "c", e) == [0, 1, 2, 3, 4]  # verified before it: kept


def test_a_connection_dropped_mid_run_resumes_and_the_shard_is_right(
    shard: Manifest, tmp_path: Path
) -> None:
    with RangeServer(str(shard.base)) as srv:
        srv.add_fault("/data-*", "drop", after=4 * PIECE + 500)  # inside piece 4
        opener, ref = ref_of(srv, shard, tmp_path / "c", piece_parallel=1)
        assert opener.ensure_cached(ref) == "fetched"  # type: ignore[attr-defined]
        starts = [int((r.range or "")[6:].split("-")[0]) for r in srv.requests("/data-*")]
        with opener.open(ref) as f:  # type: ignore[attr-defined]
            assert f.read() == source(shard)
    # the run, then one more request from where the bytes stopped (no verified piece again)
    assert starts[0] == 0 and len(starts) == 2 and 4 * PIECE <= starts[1] <= 4 * PIECE + 500
    assert opener.stats().get("checksum_failures", 0) == 0  # type: ignore[attr-defined]


def test_readers_of_different_pieces_each_get_theirs_while_runs_fill(
    shard: Manifest, tmp_path: Path
) -> None:
    want = source(shard)
    with RangeServer(str(shard.base), bandwidth=400_000) as srv:
        opener, ref = ref_of(srv, shard, tmp_path / "c", piece_parallel=2)
        got: dict[int, bytes] = {}
        errors: list[BaseException] = []

        def read(k: int) -> None:
            try:
                with opener.open(ref, start=k * PIECE, end=(k + 1) * PIECE) as f:  # type: ignore[attr-defined]
                    got[k] = f.read()
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        readers = [threading.Thread(target=read, args=(k,)) for k in (1, 4, 7)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(30)
        assert opener.drain(30)  # type: ignore[attr-defined]
        ranges = [r.range or "" for r in srv.requests("/data-*")]
    assert errors == []
    assert got == {k: want[k * PIECE : (k + 1) * PIECE] for k in (1, 4, 7)}
    assert opener.stats()["pieces_fetched"] == 9  # type: ignore[attr-defined]
    # each piece asked for once, alone or in a run; how many runs is a race (two fill
    # threads may each claim the next piece before the other's run reaches it), so that a
    # fill asks for runs is test_a_whole_fill_asks_one_request_per_run's, with one thread
    spans = sorted(tuple(int(x) // PIECE for x in r[6:].split("-")) for r in ranges)
    assert [k for lo, hi in spans for k in range(lo, hi + 1)] == list(range(9)), ranges
