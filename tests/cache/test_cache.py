"""The node-local cache in one process, against a real Range server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, make_opener, opener_for
from shardkit.cache.locks import try_lock_existing
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.format.tario.reader import read_shard
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.published import wait_published
from tests.helpers.readback import files_under, read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([10] * 8, tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shards.base)) as srv:
        yield srv


def entries(opener: object, server: RangeServer) -> tuple[Manifest, list[str]]:
    m = load_manifest(server.url("manifest.json"), opener)  # type: ignore[arg-type]
    return m, [m.resolve(s.url) for s in m.shards]


def cached_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "data").rglob("*") if p.is_file())


def test_second_read_is_served_from_the_cache(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    opener = make_opener(cache_dir=cache)
    m, urls = entries(opener, server)
    want = read_samples(shards, make_opener())
    assert read_samples(m, opener) == want
    assert len(server.requests("/data-*")) == 8
    wait_published(cache, shards.shards)
    assert read_samples(m, opener) == want
    assert len(server.requests("/data-*")) == 8  # no new request
    clone = pickle.loads(pickle.dumps(opener))  # as a DataLoader worker would get it
    assert clone.stats() == {}
    assert read_samples(m, clone) == want and clone.stats()["cache_hits"] == 8
    stats = opener.stats()
    assert stats["cache_misses"] == 8 and stats["cache_hits"] == 8
    assert stats["pieces_fetched"] == 8 and stats["cache_fills"] == 8
    assert [p.name for p in cached_files(cache)] == sorted(
        s.checksum.split(":")[1] for s in shards.shards
    )
    # a ranged read (a sample range from the index) is served from the cached file
    entry = shards.shards[3]
    offsets = read_index((Path(str(shards.base)) / str(entry.index)).read_bytes())
    lo, hi = int(offsets[2]), int(offsets[5])
    with opener.open(ObjectRef(urls[3], entry.size, entry.checksum), start=lo, end=hi) as f:
        assert [s["__key__"] for s in read_shard(f, url=urls[3], start=lo, end=hi)] == [
            f"sample-{i:08d}" for i in (32, 33, 34)
        ]
    assert len(server.requests("/data-*")) == 8


def test_content_addressed_same_names_never_collide(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    a = make_shards([5, 5], tokens=100, subdir="a")  # same file names, other bytes
    b = make_shards([6, 4], tokens=100, subdir="b")
    cache = tmp_path / "cache"
    with RangeServer(tmp_path) as srv:
        opener = make_opener(cache_dir=cache)
        for name, local in (("a", a), ("b", b)):
            remote = load_manifest(srv.url(f"{name}/manifest.json"), opener)
            assert read_samples(remote, opener) == read_samples(local, make_opener())
            wait_published(cache, local.shards)
        assert len(cached_files(cache)) == 4
        copy = tmp_path / "c"
        copy.mkdir()
        for p, rel in files_under(str(a.base)):
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            (copy / rel).write_bytes(p.read_bytes())
        remote = load_manifest(srv.url("c/manifest.json"), opener)
        assert read_samples(remote, opener) == read_samples(a, make_opener())
        assert srv.requests("/c/data-*") == []  # same checksums: already cached


def test_reader_gets_its_first_piece_while_the_shard_fills(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([40], tokens=8000, subdir="big", piece_size="128KB")  # ~1.3 MB, 11 pieces
    size = m.shards[0].size
    with RangeServer(str(m.base), bandwidth=1_000_000) as srv:
        opener = opener_for(
            IoConfig(cache=CacheConfig(cache_dir=tmp_path / "cache", piece_parallel=2))
        )
        remote, urls = entries(opener, srv)
        e = remote.shards[0]
        assert e.pieces is not None and len(e.pieces.digests) == 11
        with opener.open(ObjectRef(urls[0], e.size, e.checksum, e.pieces)) as f:
            samples = read_shard(f, url=urls[0])
            first = next(samples)
            assert first["__key__"] == "sample-00000000"
            assert srv.bytes_sent("/data-*") < size  # the shard is still arriving
            assert cached_files(tmp_path / "cache") == []  # and is not visible yet
            assert len(list(samples)) == 39
        wait_published(tmp_path / "cache", remote.shards)
    spans = sorted(
        tuple(int(x) for x in (r.range or "").removeprefix("bytes=").split("-"))
        for r in srv.requests("/data-*")
    )
    # the reader's piece alone at once, then every byte once. How many requests is a race:
    # the reader takes its next piece alone whenever it gets there before a fill thread's
    # run (a thread starting late on a busy machine leaves it all of them); that a fill
    # thread asks for runs is test_cache_runs.py's, with one thread and no reader
    assert spans[0] == (0, 127_999)
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] == size - 1


def test_a_corrupt_piece_is_fetched_again_and_never_served(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    m = make_shards([40], tokens=8000, subdir="big", piece_size="128KB")
    e = m.shards[0]
    want = read_samples(m, make_opener())
    with RangeServer(str(m.base)) as srv:
        opener = make_opener(cache_dir=tmp_path / "cache")
        remote, urls = entries(opener, srv)
        srv.add_fault("/data-*", "corrupt", at=3 * 128_000 + 77)  # once, in piece 3
        assert read_samples(remote, opener) == want
        spans = [
            tuple(int(x) for x in (r.range or "").removeprefix("bytes=").split("-"))
            for r in srv.requests("/data-*")
        ]
        # the request that met the fault (alone or a run), then piece 3 alone once more
        has3 = [i for i, (lo, hi) in enumerate(spans) if lo <= 3 * 128_000 <= hi]
        assert len(has3) == 2 and spans[has3[1]] == (384_000, 511_999), spans
        # else the reader's pieces alone and runs of pieces, one ranged request each (how the
        # reader and the fill threads share them out is a race, and so is how many requests:
        # a fill thread starting late leaves the reader every piece alone): every piece
        # fetched, none more than twice; only the pieces after piece 3 in the run that met
        # the fault (let go unkept when it failed) may come twice
        npieces = -(-e.size // 128_000)
        times = [sum(lo <= k * 128_000 <= hi for lo, hi in spans) for k in range(npieces)]
        again = {k for k, n in enumerate(times) if n > 1} - {3}
        assert min(times) == 1 and max(times) == 2, spans
        assert again <= set(range(4, spans[has3[0]][1] // 128_000 + 1)), spans
        assert (0, 127_999) in spans, spans
        assert opener.stats()["checksum_failures"] == 1
        # twice corrupt: a ChecksumError naming the shard and the piece, not a byte of it read
        # (nor fetched a third time by a reader that waited for the thread that failed it)
        srv.add_fault("/data-*", "corrupt", at=5 * 128_000 + 1, times=2)
        cache2 = tmp_path / "cache2"
        strict = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache2, piece_parallel=1)))
        got: list[str] = []
        with (
            pytest.raises(ChecksumError) as info,
            strict.open(ObjectRef(urls[0], e.size, e.checksum, e.pieces)) as f,
        ):
            got.extend(str(s["__key__"]) for s in read_shard(f, url=urls[0]))
        assert info.value.url == urls[0] and "piece 5 (bytes 640000..768000)" in str(info.value)
        assert e.pieces is not None and info.value.expected == f"xxh3_128:{e.pieces.digests[5]}"
        offsets = read_index((Path(str(m.base)) / str(e.index)).read_bytes())
        assert len(got) <= sum(1 for o in offsets[1:] if o <= 5 * 128_000)  # before piece 5
        assert cached_files(cache2) == []


def corrupt(path: Path) -> bytes:
    good = path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 3] ^= 0x01
    path.write_bytes(bytes(bad))
    return good


def test_corrupt_byte_is_detected_and_never_cached(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    entry = shards.shards[4]
    good = corrupt(Path(str(shards.base)) / entry.url)
    opener = make_opener(cache_dir=cache)
    _, urls = entries(opener, server)
    for _ in range(2):  # the second try does not find a cached "valid" copy either
        with (
            pytest.raises(ChecksumError) as info,
            opener.open(ObjectRef(urls[4], entry.size, entry.checksum)) as f,
        ):
            list(read_shard(f, url=urls[4]))
        # no pieces given (an older manifest): the one piece is the shard, its checksum
        assert info.value.url == urls[4] and info.value.expected == entry.checksum
        assert "piece 0 (bytes 0..139264)" in str(info.value)
        assert cached_files(cache) == []
    assert len(server.requests("/" + entry.url)) == 4  # fetched again once, per try
    assert opener.stats()["checksum_failures"] == 4
    (Path(str(shards.base)) / entry.url).write_bytes(good)  # the server is fixed
    with opener.open(ObjectRef(urls[4], entry.size, entry.checksum)) as f:
        assert len(list(read_shard(f, url=urls[4]))) == 10
    wait_published(cache, [entry])
    assert len(cached_files(cache)) == 1
    assert list(CacheStore(str(cache)).parts()) == []


def test_pieces_that_are_not_the_shards_are_never_published(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    opener = make_opener(cache_dir=cache)
    _, urls = entries(opener, server)
    a, b = shards.shards[0], shards.shards[1]
    assert a.size == b.size
    # shard 0's pieces (they match its bytes) under shard 1's checksum: its reader gets
    # a ChecksumError once the whole shard is checked (issue 19 finding 1)
    with (
        pytest.raises(ChecksumError, match="pieces listed are not this shard"),
        opener.open(ObjectRef(urls[0], a.size, b.checksum, a.pieces)) as f,
    ):
        f.read()
    with pytest.raises(ChecksumError, match="pieces listed are not this shard") as info:
        opener.ensure_cached(ObjectRef(urls[0], a.size, b.checksum, a.pieces))
    assert info.value.expected == b.checksum and info.value.actual == a.checksum
    assert cached_files(cache) == [] and list(CacheStore(str(cache)).parts()) == []


def test_a_reader_waits_for_another_fills_piece_at_most_cache_wait(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    from shardkit.cache.layout import FillPieces
    from shardkit.cache.locks import claim_byte, unlock
    from shardkit.errors import CacheError

    cache = tmp_path / "cache"
    store = CacheStore(str(cache))
    e = shards.shards[2]
    key, layout = CacheKey.of(e.checksum, e.size), FillPieces.of(e.size, e.pieces)
    fd, published = store.open_part(key, layout)
    assert fd is not None and not published
    holder = claim_byte(fd, e.size)  # a fill that holds piece 0 and never finishes it
    assert holder is not None
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache, cache_wait=0.5)))
    _, urls = entries(opener, server)
    with (
        pytest.raises(CacheError, match=r"waited \d+ s for piece 0") as info,
        opener.open(ObjectRef(urls[2], e.size, e.checksum, e.pieces)) as f,
    ):
        f.read()
    assert urls[2] in str(info.value)
    assert server.requests("/" + e.url) == []
    unlock(holder)  # its process dies: the next reader fetches the piece itself
    with opener.open(ObjectRef(urls[2], e.size, e.checksum, e.pieces)) as f:
        assert f.read() == (Path(str(shards.base)) / e.url).read_bytes()
    os.close(fd)


Look = tuple[frozenset[tuple[str, int, int]], dict[tuple[int, int], int]]


def look(cache: Path) -> Look:
    """One look at what holds the cache's bytes: the directories and files under data/
    and tmp/ and the files there this process has open (removed or not), each as
    ``(where, dev, inode)``; and the size of each file's inode."""
    where: set[tuple[str, int, int]] = set()
    sizes: dict[tuple[int, int], int] = {}
    dirs = [str(cache / "tmp"), str(cache / "data")]
    while dirs:
        with contextlib.suppress(FileNotFoundError), os.scandir(dirs.pop()) as entries:
            for e in entries:
                with contextlib.suppress(FileNotFoundError):  # gone: not there at that time
                    st = e.stat(follow_symlinks=False)
                    where.add((e.path, st.st_dev, st.st_ino))
                    if stat.S_ISDIR(st.st_mode):
                        dirs.append(e.path)
                    else:
                        sizes[st.st_dev, st.st_ino] = st.st_size
    inside = (str(cache / "data") + os.sep, str(cache / "tmp") + os.sep)
    for fd in os.listdir("/proc/self/fd"):
        link = f"/proc/self/fd/{fd}"
        with contextlib.suppress(OSError):  # closed meanwhile: not open at that time
            st, target, again = os.stat(link), os.readlink(link), os.stat(link)
            same = (st.st_dev, st.st_ino) == (again.st_dev, again.st_ino)  # fd not reused
            if same and target.startswith(inside) and not stat.S_ISDIR(st.st_mode):
                where.add((f"fd:{target}", st.st_dev, st.st_ino))
                sizes[st.st_dev, st.st_ino] = st.st_size
    return frozenset(where), sizes


def disk_bytes(first: Look, second: Look) -> int | None:
    """The bytes the cache held on disk at one instant between two looks, or None if its
    files changed in between.

    One look is no snapshot: a shard evicted after its directory was read and a temp file
    created before the next directory was read are both counted, although they never
    were on disk together. Two looks that find the same files are one (the "double
    collect"): each file was there from the first look at it to the second, so all of
    them were there together at the instant between the two looks. Temp files only grow,
    so the smaller of the two sizes seen is at most what that instant held. Removed files
    still open count: their bytes are still on disk.
    """
    if first[0] != second[0]:
        return None
    return sum(min(size, second[1][f]) for f, size in first[1].items())


def test_eviction_keeps_the_limit_and_spares_a_shard_in_use(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    size = max(s.size for s in shards.shards)
    limit = 3 * (size + 1)  # room for 3 shards and the piece map of one being filled
    cache = tmp_path / "cache"
    opener = opener_for(
        IoConfig(cache=CacheConfig(cache_dir=cache, cache_limit=limit, prefetch_depth=1))
    )
    store = CacheStore(str(cache), limit)
    m, urls = entries(opener, server)
    want = read_samples(shards, make_opener())
    peak = [0]
    stop = threading.Event()

    def watch() -> None:  # snapshots of the disk use all through the run
        while not stop.wait(0.002):
            held = disk_bytes(look(cache), look(cache))
            peak[0] = max(peak[0], held or 0)

    watcher = threading.Thread(target=watch)
    watcher.start()
    first = m.shards[0]
    held = opener.open(ObjectRef(urls[0], first.size, first.checksum))
    held_samples = read_shard(held, url=urls[0])
    got = [next(held_samples)]
    first_path = store.path(CacheKey.of(first.checksum, first.size))
    try:
        for i in range(1, 8):
            e = m.shards[i]
            opener.prefetch(
                [
                    ObjectRef(u, s.size, s.checksum)
                    for u, s in zip(urls[i + 1 :], m.shards[i + 1 :], strict=True)
                ]
            )
            with opener.open(ObjectRef(urls[i], e.size, e.checksum)) as f:
                assert list(read_shard(f, url=urls[i])) == want[10 * i : 10 * i + 10]
            assert store.usage() <= limit
            assert os.path.exists(first_path)  # leased: never evicted while read
        got.extend(held_samples)
        held.close()
    finally:
        stop.set()
        watcher.join()
    assert got == want[:10]
    assert opener.drain(60)  # the run is over once its background prefetches end
    # then: the cached shards, nothing in tmp/ and no removed file still open
    after = next(filter(None, (disk_bytes(look(cache), look(cache)) for _ in range(50))), None)
    assert after == sum(p.stat().st_size for p in cached_files(cache))
    assert 0 < max(peak[0], after) <= limit
    stats = opener.stats()
    assert stats["cache_misses"] + stats.get("cache_hits", 0) == 8
    # every shard was fetched whole exactly once, although some were evicted for others
    for s in m.shards:
        assert server.bytes_sent("/" + s.url) == s.size
    assert len(cached_files(cache)) == 3


def test_prefetch_fetches_the_next_shards_in_the_background(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=tmp_path / "cache", prefetch_depth=2)))
    m, urls = entries(opener, server)
    plan = [ObjectRef(u, s.size, s.checksum, s.pieces) for u, s in zip(urls, m.shards, strict=True)]
    opener.prefetch(plan[1:])  # the next two of this worker's plan; the rest is too deep
    with opener.open(ObjectRef(urls[0], m.shards[0].size, m.shards[0].checksum)) as f:
        assert len(list(read_shard(f, url=urls[0]))) == 10
    for i in (1, 2):
        e = m.shards[i]
        with opener.open(ObjectRef(urls[i], e.size, e.checksum, e.pieces)) as f:
            assert len(list(read_shard(f, url=urls[i]))) == 10
        wait_published(tmp_path / "cache", [e])
    assert opener.stats()["prefetches"] == 2
    assert [len(server.requests("/" + s.url)) for s in m.shards] == [1, 1, 1, 0, 0, 0, 0, 0]


def test_a_prefetched_shard_is_leased_before_it_is_published(
    shards: Manifest, server: RangeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # else an eviction between its publish and its lease could throw it away unread
    cache = tmp_path / "cache"
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache, prefetch_depth=1)))
    m, urls = entries(opener, server)
    store = CacheStore(str(cache))
    e = m.shards[1]
    key = CacheKey.of(e.checksum, e.size)
    leased: list[bool] = []
    published = threading.Event()
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if src == store.part_path(key):
            fd = try_lock_existing(src)  # an eviction's lock: None while a lease is held
            leased.append(fd is None)
            if fd is not None:
                os.close(fd)
        real_replace(src, dst)
        if src == store.part_path(key):
            published.set()

    monkeypatch.setattr(os, "replace", replace)
    opener.prefetch([ObjectRef(urls[1], e.size, e.checksum)])
    assert published.wait(30)
    monkeypatch.undo()
    assert leased == [True]
    assert try_lock_existing(store.path(key)) is None  # still leased, now as the shard
    with opener.open(ObjectRef(urls[1], e.size, e.checksum)) as f:
        assert len(list(read_shard(f, url=urls[1]))) == 10
    fd = try_lock_existing(store.path(key))  # read: its reader let go, and so did the hint
    assert fd is not None
    os.close(fd)
    assert len(server.requests("/" + e.url)) == 1


def test_node_request_cap(shards: Manifest, tmp_path: Path) -> None:
    with RangeServer(str(shards.base), latency=0.05) as srv:
        opener = opener_for(
            IoConfig(cache=CacheConfig(cache_dir=tmp_path / "cache", node_requests=1))
        )
        m, urls = entries(opener, srv)
        errors: list[BaseException] = []

        def read(i: int) -> None:
            try:
                e = m.shards[i]
                with opener.open(ObjectRef(urls[i], e.size, e.checksum)) as f:
                    f.read()
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        spans = sorted((r.start, r.end) for r in srv.requests("/data-*"))
        assert len(spans) == 8
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_a_temp_file_of_another_shape_is_replaced(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    store = CacheStore(str(cache))
    store.ensure()
    e = shards.shards[0]
    key = CacheKey.of(e.checksum, e.size)
    Path(store.part_path(key)).write_bytes(b"half a shard")  # not what a fill leaves
    opener = make_opener(cache_dir=cache)
    _, urls = entries(opener, server)
    with opener.open(ObjectRef(urls[0], e.size, e.checksum)) as f:
        assert f.read() == (Path(str(shards.base)) / e.url).read_bytes()
    wait_published(cache, [e])
    assert list(store.parts()) == []


def test_unwritable_cache_reads_uncached(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    opener = make_opener(cache_dir=blocker / "cache")
    m, _ = entries(opener, server)
    assert read_samples(m, opener) == read_samples(shards, make_opener())
    assert opener.stats()["cache_errors"] >= 1
    strict = opener_for(
        IoConfig(cache=CacheConfig(cache_dir=blocker / "cache", on_cache_error="raise"))
    )
    from shardkit.errors import CacheError

    with pytest.raises(CacheError, match="not-a-dir"):
        read_samples(m, strict)


def test_cache_cli_warm_stat_clean(shards: Manifest, server: RangeServer, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from shardkit.cli import cli
    from shardkit.cli.cache import rank_shards
    from shardkit.streaming.dataset import ShardDataset

    cache = str(tmp_path / "cache")
    runner = CliRunner()
    url = server.url("manifest.json")
    warm = ["cache", "warm", url, "--cache-dir", cache, "--rank", "1", "--world-size", "2"]
    res = runner.invoke(cli, [*warm, "--epoch", "1", "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    mine = rank_shards(shards, seed=3, epoch=1, rank=1, world=2, shuffle=True, remainder="drop")
    other = rank_shards(shards, seed=3, epoch=1, rank=0, world=2, shuffle=True, remainder="drop")
    assert set(mine) | set(other) == set(range(8)) and len(mine) < 8
    summary = json.loads(res.stdout)["summary"]
    assert summary["fetched"] == len(mine) and summary["shards"] == len(mine)
    fetched = sorted(r.path for r in server.requests("/data-*.tar"))
    assert fetched == sorted("/" + shards.shards[i].url for i in mine)
    # rank 1's epoch 1 now reads no shard from the server
    server.clear_log()
    ds = ShardDataset(url, seed=3, cache_dir=cache).split_by_node(rank=1, world_size=2)
    ds.set_epoch(1)
    keys = [s["__key__"] for s in ds]
    assert len(keys) == shards.total_samples // 2
    assert server.requests("/data-*.tar") == []
    res = runner.invoke(cli, ["cache", "stat", "--cache-dir", cache, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["shards"] == len(mine)
    res = runner.invoke(cli, ["cache", "clean", "--cache-dir", cache, "--all"])
    assert res.exit_code == 0 and f"evicted {len(mine)} shards" in res.output
    assert cached_files(tmp_path / "cache") == []
    res = runner.invoke(cli, ["cache", "clean", "--cache-dir", cache])
    assert res.exit_code == 2 and "--keep" in res.output


def test_node_manifest_copy_is_revalidated_with_its_etag(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    url = server.url("manifest.json")
    fresh = make_opener(cache_dir=cache)  # default ttl: the node's copy is used as is
    first = load_manifest(url, fresh)
    assert load_manifest(url, make_opener(cache_dir=cache)).shards == first.shards
    assert len(server.requests("/manifest.json")) == 1
    # always ask, conditionally
    stale = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache, manifest_ttl=0)))
    assert load_manifest(url, stale).shards == first.shards
    reqs = server.requests("/manifest.json")
    assert len(reqs) == 2 and reqs[1].status == 304
    path = Path(str(shards.base)) / "manifest.json"
    st = path.stat()
    assert reqs[1].headers["If-None-Match"] == f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
    path.write_text(Manifest(shards=first.shards[:3]).dumps())
    os.utime(path, ns=(1, 1))  # a new ETag even within the same clock tick
    assert len(load_manifest(url, stale).shards) == 3
    assert server.requests("/manifest.json")[-1].status == 200
    assert len(load_manifest(url, make_opener(cache_dir=cache)).shards) == 3  # the new copy


def test_cache_verify_evicts_a_rotted_shard(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    """`shardkit cache verify`: every cached shard hashed again; one whose bytes rotted on
    disk is named and evicted (exit 1), the next read fetches it again, then all is clean."""
    from click.testing import CliRunner

    from shardkit.cache import CacheStore
    from shardkit.cli import cli
    from shardkit.streaming.dataset import ShardDataset

    def keys(ds: ShardDataset) -> list[str]:
        return [str(s["__key__"]) for s in ds]  # read to the end: its leases end with it

    cache = str(tmp_path / "cache")
    url = server.url("manifest.json")
    want = keys(ShardDataset(url, seed=1, cache_dir=cache))
    runner = CliRunner()
    ok = runner.invoke(cli, ["cache", "verify", "--cache-dir", cache, "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["bad"] == [], ok.output
    rotten = sorted(CacheStore(cache).shards(), key=lambda s: s.path)[2].path
    with open(rotten, "r+b") as f:  # a flipped byte on disk
        f.seek(700)
        byte = f.read(1)
        f.seek(700)
        f.write(bytes([byte[0] ^ 0xFF]))
    res = runner.invoke(cli, ["cache", "verify", "--cache-dir", cache])
    assert res.exit_code == 1 and f"BAD {rotten}" in res.output, res.output
    assert not os.path.exists(rotten)
    server.clear_log()
    assert keys(ShardDataset(url, seed=1, cache_dir=cache)) == want
    assert len(server.requests("/data-*.tar")) >= 1, "the evicted shard is fetched again"
    again = runner.invoke(cli, ["cache", "verify", "--cache-dir", cache])
    assert again.exit_code == 0, again.output
