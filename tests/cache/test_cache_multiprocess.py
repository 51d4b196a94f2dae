"""The node-local cache shared by real processes: ranks and workers, independent jobs, and
a downloader killed with SIGKILL. Every process reads through ``make_opener`` +
``load_manifest`` + ``read_shard(opener.open(...))`` against a Range server on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import CacheKey, CacheStore, make_opener, opener_for, upkeep
from shardkit.cache.layout import FillPieces
from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.tario.index import read_index
from shardkit.format.tario.reader import read_shard
from shardkit.io import CacheConfig, IoConfig, load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def digest(samples: list[dict[str, object]]) -> str:
    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            h.update(k.encode())
            v = s[k]
            h.update(v if isinstance(v, bytes) else str(v).encode())
    return f"{len(samples)}:{h.hexdigest()}"


def read_all(manifest_url: str, cache_dir: str) -> tuple[str, dict[str, float]]:
    """What one rank/worker does: load the manifest, read every shard."""
    opener = make_opener(cache_dir=cache_dir)
    m = load_manifest(manifest_url, opener)
    return digest(read_samples(m, opener)), opener.stats()


def worker(manifest_url: str, cache_dir: str, barrier: Any, out: Any) -> None:
    barrier.wait()  # every process starts at once, so they race for each shard
    out.put(read_all(manifest_url, cache_dir))


def run_processes(n: int, manifest_url: str, cache_dir: str) -> list[tuple[str, dict[str, float]]]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(manifest_url, cache_dir, barrier, out)) for _ in range(n)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def job_main(argv: list[str]) -> None:
    """An independent job (its own process tree): 2 workers, started on a line of stdin."""
    manifest_url, cache_dir = argv
    print("ready", flush=True)
    sys.stdin.readline()
    results = run_processes(2, manifest_url, cache_dir)
    print(json.dumps(results), flush=True)


def download_main(argv: list[str]) -> None:
    """Open one shard through the cache and read it (the test kills this process)."""
    url, size, checksum, cache_dir = argv
    opener = make_opener(cache_dir=cache_dir)
    with opener.open(ObjectRef(url, int(size), checksum)) as f:
        f.read()


def full_disk_main(argv: list[str]) -> None:
    """Read a data set through a cache on a "disk" that takes only ``limit`` more bytes
    per file (RLIMIT_FSIZE: writes past it fail with EFBIG, as a full disk fails them)."""
    import resource

    from shardkit.errors import CacheError

    manifest_url, cache_dir, limit, mode = argv
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache_dir, on_cache_error=mode)))
    m = load_manifest(manifest_url, opener)
    try:
        result = {"digest": digest(read_samples(m, opener)), "stats": opener.stats()}
    except CacheError as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(result), flush=True)


def spawn(main: str, *args: str, pipes: bool = False) -> subprocess.Popen[str]:
    """Run ``main(args)`` of this module in a new Python process (its own process tree)."""
    code = f"import sys; from {__name__} import {main}; {main}(sys.argv[1:])"
    io = subprocess.PIPE if pipes else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdin=io, stdout=io, text=True
    )


@pytest.fixture
def shards(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([10] * 6, tokens=3000, subdir="ds")


@pytest.fixture
def server(shards: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shards.base), latency=0.01, bandwidth=4_000_000) as srv:
        yield srv


def assert_each_shard_fetched_once(server: RangeServer, m: Manifest) -> None:
    for s in m.shards:
        reqs = server.requests("/" + s.url)
        assert len(reqs) == 1 and reqs[0].sent == s.size, s.url


def test_two_ranks_two_workers_share_one_download(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    want = digest(read_samples(shards, make_opener()))
    results = run_processes(4, server.url("manifest.json"), cache)
    assert [d for d, _ in results] == [want] * 4
    assert len(server.requests("/manifest.json")) == 1
    assert_each_shard_fetched_once(server, shards)
    total = {k: sum(st.get(k, 0) for _, st in results) for k in ("requests", "pieces_fetched")}
    assert total["requests"] == 1 + len(shards)
    assert total["pieces_fetched"] == len(shards)  # one piece each, fetched by one process
    server.clear_log()
    again = run_processes(4, server.url("manifest.json"), cache)  # the second epoch
    assert [d for d, _ in again] == [want] * 4
    assert server.requests() == []  # no shard requests, and the node's manifest is fresh
    assert all(st["cache_hits"] == len(shards) for _, st in again)


def test_two_independent_jobs_on_one_cache_dir(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    want = digest(read_samples(shards, make_opener()))
    jobs = [spawn("job_main", server.url("manifest.json"), cache, pipes=True) for _ in range(2)]
    for j in jobs:
        assert j.stdout is not None and j.stdout.readline().strip() == "ready"
    for j in jobs:
        assert j.stdin is not None
        j.stdin.write("go\n")
        j.stdin.flush()
    outs = [j.communicate(timeout=120)[0] for j in jobs]
    assert [j.returncode for j in jobs] == [0, 0]
    digests = [d for out in outs for d, _ in json.loads(out)]
    assert digests == [want] * 4
    assert_each_shard_fetched_once(server, shards)
    assert len(server.requests("/manifest.json")) == 1


PIECE = 128_000


@pytest.fixture
def big(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([40], tokens=8000, subdir="big", piece_size=PIECE)  # ~1.3 MB, 11 pieces


def pieces_in(ranges: list[str]) -> list[int]:
    """The pieces the ranged requests ``ranges`` asked for (a run of pieces per request)."""
    out: list[int] = []
    for r in ranges:
        lo, hi = (int(x) for x in r.removeprefix("bytes=").split("-"))
        out.extend(range(lo // PIECE, hi // PIECE + 1))
    return sorted(out)


def verified(store: CacheStore, key: CacheKey, n: int, e: ShardEntry) -> list[int]:
    """The pieces a temp file's map says are verified."""
    with open(store.part_path(key, FillPieces.of(key.size, e.pieces)), "rb") as f:
        f.seek(key.size)
        return [k for k, b in enumerate(f.read(n)) if b]


def pieces_main(argv: list[str]) -> None:
    """Read one shard (or the samples ``[lo, hi)`` of it) through the cache, with pieces."""
    manifest_url, cache_dir, lo, hi = argv[0], argv[1], int(argv[2]), int(argv[3])
    opener = opener_for(IoConfig(cache=CacheConfig(cache_dir=cache_dir, piece_parallel=1)))
    m = load_manifest(manifest_url, opener)
    e = m.shards[0]
    url = m.resolve(e.url)
    offsets = read_index(opener.read(m.resolve(str(e.index))))
    start, end = int(offsets[lo]), int(offsets[hi])
    with opener.open(ObjectRef(url, e.size, e.checksum, e.pieces), start=start, end=end) as f:
        keys = [str(s["__key__"]) for s in read_shard(f, url=url, start=start, end=end)]
    print(json.dumps({"keys": keys, "stats": opener.stats()}), flush=True)


def test_sigkill_mid_fill_then_rerun_fetches_only_the_missing_pieces(
    big: Manifest, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    e = big.shards[0]
    store = CacheStore(cache)
    key = CacheKey.of(e.checksum, e.size)
    with RangeServer(str(big.base), bandwidth=600_000) as srv:
        url = srv.url("manifest.json")
        proc = spawn("pieces_main", url, cache, "0", "40")
        srv.wait_body("/" + e.url, PIECE)  # a piece or more is in
        while len(verified(store, key, 11, e)) < 3:  # a few pieces verified, the rest not
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        done = verified(store, key, 11, e)
        assert 3 <= len(done) < 11
        assert not os.path.exists(store.path(key))  # never visible as a shard
        before = {r.range for r in srv.requests("/" + e.url)}
        srv.clear_log()
        srv.throttle.rate = None
        rerun = spawn("pieces_main", url, cache, "0", "40", pipes=True)
        out = json.loads(rerun.communicate(timeout=60)[0])
        assert out["keys"] == [f"sample-{i:08d}" for i in range(40)]
        again = sorted(r.range or "" for r in srv.requests("/" + e.url))
        missing = [k for k in range(11) if k not in done]
        # the server's log: only those, each once (alone or in runs: how many requests is
        # a race, the rerun's reader taking its next piece alone whenever it gets there
        # before its fill thread's run does)
        assert pieces_in(again) == missing
        assert set(done) <= set(pieces_in([r or "" for r in before]))
        # the rerun's reader may be done (and its process gone) while a fill thread still
        # hashes the whole shard to publish it; a temp file with every piece verified is
        # then published by the next open, without a request
        if not os.path.exists(store.path(key)):
            assert verified(store, key, 11, e) == list(range(11))
            opener = make_opener(cache_dir=cache)
            m = load_manifest(url, opener)
            assert (
                opener.ensure_cached(ObjectRef(m.resolve(e.url), e.size, e.checksum, e.pieces))
                == "fetched"
            )
        assert os.path.getsize(store.path(key)) == e.size
        assert list(store.parts()) == []
        assert sorted(r.range or "" for r in srv.requests("/" + e.url)) == again


def test_two_processes_at_different_offsets_of_one_shard_both_stream_at_once(
    big: Manifest, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    e = big.shards[0]
    offsets = read_index((Path(str(big.base)) / str(e.index)).read_bytes())
    mid = 30  # sample 30 starts in piece 8 of 11: a rank whose range starts mid-shard
    first = int(offsets[mid]) // PIECE
    assert first >= 7
    with RangeServer(str(big.base), per_connection=250_000) as srv:
        url = srv.url("manifest.json")
        procs = [
            spawn("pieces_main", url, cache, "0", str(mid), pipes=True),
            spawn("pieces_main", url, cache, str(mid), "40", pipes=True),
        ]
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert outs[0]["keys"] == [f"sample-{i:08d}" for i in range(mid)]
    assert outs[1]["keys"] == [f"sample-{i:08d}" for i in range(mid, 40)]
    reqs = srv.requests("/" + e.url)
    # a process that is done leaves its background pieces to the other (a piece in flight
    # when it exits is fetched again there), but every piece was verified exactly once
    assert set(pieces_in([r.range or "" for r in reqs])) == set(range(11))

    # the second reader's own piece was fetched at once, not after the pieces before it:
    # alone, or in a run of pieces (73e17f8) that another fill had begun with them. Alone,
    # its request may reach the server a moment after a run the other process claimed just
    # after it (the pieces before it, up to it): the order of two requests sent within
    # milliseconds is a race, so "at once" is within half a piece's time on a connection
    # (0.26 s; a piece fetched after the ones before it comes a whole piece's time later)
    def first_holding(k: int) -> float:
        return min(r.start for r in reqs if k in pieces_in([r.range or ""]))

    assert first_holding(first) <= first_holding(first - 2) + PIECE / 250_000 / 2
    assert sum(o["stats"].get("pieces_fetched", 0) for o in outs) == 11


def rank_main(argv: list[str]) -> None:
    """One rank of a 2-rank job (a process of its own, as torchrun starts it):
    ShardDataset + WebLoader with 2 DataLoader workers, for ``epochs`` epochs."""
    from shardkit.streaming.dataset import ShardDataset
    from shardkit.streaming.loader import WebLoader

    manifest_url, cache_dir, rank, epochs = argv[0], argv[1], int(argv[2]), int(argv[3])
    ds = ShardDataset(manifest_url, seed=5, cache_dir=cache_dir).split_by_node(rank, 2)
    loader = WebLoader(ds, num_workers=2)
    keys = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        keys.append([s["__key__"] for s in loader])
    print(json.dumps({"keys": keys, "io": loader.stats().get("io", {})}), flush=True)


def test_dataset_and_loader_share_the_cache_across_ranks_and_workers(
    shards: Manifest, server: RangeServer, tmp_path: Path
) -> None:
    url, cache = server.url("manifest.json"), str(tmp_path / "cache")
    ranks = [spawn("rank_main", url, cache, str(r), "2", pipes=True) for r in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0]
    everything = sorted(f"sample-{i:08d}" for i in range(shards.total_samples))
    for epoch in range(2):
        assert sorted(k for out in outs for k in out["keys"][epoch]) == everything
    assert_each_shard_fetched_once(server, shards)  # over both epochs, 2 ranks x 2 workers
    assert len(server.requests("/manifest.json")) == 1
    assert sum(out["io"].get("cache_hits", 0) for out in outs) > 0


@pytest.mark.parametrize("mode", ["bypass", "raise"])
def test_full_disk_reads_on_uncached_or_raises(
    shards: Manifest, server: RangeServer, tmp_path: Path, mode: str
) -> None:
    cache = str(tmp_path / "cache")
    job = spawn("full_disk_main", server.url("manifest.json"), cache, "50000", mode, pipes=True)
    out = json.loads(job.communicate(timeout=120)[0])
    assert job.returncode == 0
    if mode == "raise":
        # the temp file is sized up front (sparse): a "disk" too small refuses it at once
        assert out["error"] == "CacheError" and "cannot reserve" in out["message"]
        assert cache in out["message"]
        return
    assert out["digest"] == digest(read_samples(shards, make_opener()))
    stats = out["stats"]
    assert stats["cache_errors"] == len(shards)  # every shard failed to cache, clearly
    assert stats["uncached_reads"] == len(shards)  # and was read on without the cache
    assert upkeep.stat(CacheStore(cache)).shards == 0 and list(CacheStore(cache).parts()) == []
