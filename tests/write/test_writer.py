"""ShardWriter: rollover, reproducibility, atomicity, errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit import ConfigError, Manifest, ShardWriter, WriterError, read_shard
from shardkit.format.checksum import file_checksum
from shardkit.format.manifest.journal import journal_path, read_journal
from shardkit.format.tario.index import read_index
from tests.helpers.data import make_samples
from tests.helpers.readback import hidden_leftovers


def _random_samples(n: int, seed: int, max_bytes: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "__key__": f"s/{i:05d}",
            "bin": rng.bytes(int(rng.integers(0, max_bytes))),
            "json": {"i": i},
        }
        for i in range(n)
    ]


def _write(out: Path, samples: list[dict[str, Any]], **kwargs: Any) -> Manifest:
    with ShardWriter(out, **kwargs) as w:
        for s in samples:
            w.write(s)
    return Manifest.load(out / "manifest.json")


def _assert_whole(out: Path, manifest: Manifest) -> None:
    """Every listed shard is on disk with its size and checksum."""
    for e in manifest.shards:
        path = out / e.url
        with open(path, "rb") as f:
            assert file_checksum(f, manifest.checksum_algorithm) == (e.checksum, e.size)


@pytest.mark.parametrize("maxsize", [8192, 20_000, 65_536])
def test_rollover_by_size_counts_real_bytes(tmp_path: Path, maxsize: int) -> None:
    samples = _random_samples(60, seed=maxsize, max_bytes=9000)
    m = _write(tmp_path, samples, maxsize=maxsize)
    assert len(m.shards) > 3 and m.total_samples == 60
    for e in m.shards:
        size = os.path.getsize(tmp_path / e.url)
        assert size == e.size
        assert size <= maxsize or e.nsamples == 1, (e.url, size, e.nsamples)
        assert size % 512 == 0
    # shards are filled: the next shard's first sample would not have fitted
    back = [s for e in m.shards for s in read_shard(tmp_path / e.url)]
    assert [s["__key__"] for s in back] == [s["__key__"] for s in samples]
    _assert_whole(tmp_path, m)


def test_an_oversized_sample_gets_a_shard_of_its_own(tmp_path: Path) -> None:
    samples = [
        {"__key__": "a", "bin": b"x" * 100},
        {"__key__": "b", "bin": b"y" * 20_000},
        {"__key__": "c", "bin": b"z" * 100},
    ]
    m = _write(tmp_path, samples, maxsize=8192)
    assert [e.nsamples for e in m.shards] == [1, 1, 1]
    assert m.shards[1].size > 8192


def test_rollover_by_count(tmp_path: Path) -> None:
    m = _write(tmp_path, list(make_samples(23)), maxcount=5)
    assert [e.nsamples for e in m.shards] == [5, 5, 5, 5, 3]
    assert [e.url for e in m.shards] == [f"data-{i:06d}.tar" for i in range(5)]


@pytest.mark.parametrize("compress", [None, "zstd"])
@pytest.mark.parametrize("algo", ["sha256", "xxh3_128"])
def test_same_input_gives_byte_identical_shards(
    tmp_path: Path, compress: str | None, algo: str
) -> None:
    samples = _random_samples(50, seed=3, max_bytes=4000)
    a = _write(tmp_path / "a", samples, maxsize=30_000, compress=compress, checksum=algo)
    b = _write(tmp_path / "b", samples, maxsize=30_000, compress=compress, checksum=algo)
    assert [e.to_dict() for e in a.shards] == [e.to_dict() for e in b.shards]
    for e in a.shards:
        assert (tmp_path / "a" / e.url).read_bytes() == (tmp_path / "b" / e.url).read_bytes()
        assert e.checksum.startswith(algo + ":")
    _assert_whole(tmp_path / "a", a)


def test_zstd_shards_compress_and_read_back(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i}", "txt": b"repetitive text " * 200} for i in range(20)]
    m = _write(tmp_path, samples, compress="zstd", maxcount=10)
    assert all(e.url.endswith(".tar.zst") for e in m.shards)
    assert all(e.size < 10 * 4000 / 5 for e in m.shards)  # really compressed
    back = [s for e in m.shards for s in read_shard(tmp_path / e.url)]
    assert back == [{"__key__": s["__key__"], "txt": s["txt"]} for s in samples]
    _assert_whole(tmp_path, m)


def test_duplicate_key_in_a_shard_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    with ShardWriter(tmp_path) as w:
        w.write({"__key__": "a", "txt": "1"})
        fields = {k: dict(v) for k, v in w.manifest.fields.items()}
        with pytest.raises(WriterError, match="twice"):
            w.write({"__key__": "a", "txt": "2"})
        assert w.manifest.fields == fields
        w.write({"__key__": "b", "txt": "3"})
    assert [s["__key__"] for s in read_shard(tmp_path / "data-000000.tar")] == ["a", "b"]


def test_same_key_in_another_shard_is_allowed(tmp_path: Path) -> None:
    m = _write(tmp_path, [{"__key__": "a", "txt": "1"}, {"__key__": "a", "txt": "2"}], maxcount=1)
    assert m.total_samples == 2


@pytest.mark.parametrize(
    "key", [None, "", "/abs", "a/../b", "..", "a.b", "dir/", "C:x", "a\\b", "\udcff", 5]
)
def test_keys_that_would_not_round_trip(tmp_path: Path, key: object) -> None:
    with ShardWriter(tmp_path) as w, pytest.raises(WriterError):
        w.write({"__key__": key, "txt": "x"})


class _Opaque:
    pass


@pytest.mark.parametrize(
    "fields",
    [
        {"json": _Opaque()},
        {"json": {"nested": {1, 2}}},
        {"tokens.npy": [[1, 2], [3]]},
        {"tokens.npy": np.array([object()], dtype=object)},
        {"pickle": lambda: 0},
        {"txt": "bad \udcff surrogate"},
        {"bin": 1.5},
        {"cls": True},
        {"bad/field": b"x"},
        {".txt": b"x"},
        {"f\udcff": b"x"},
        {3: b"x"},
    ],
)
def test_fields_that_cannot_be_encoded(tmp_path: Path, fields: dict[Any, Any]) -> None:
    with ShardWriter(tmp_path) as w:
        w.write({"__key__": "ok", "txt": "fine"})
        before = {k: dict(v) for k, v in w.manifest.fields.items()}
        with pytest.raises(WriterError):
            w.write({"__key__": "k", "txt": "partial", **fields})
        assert w.manifest.fields == before
    assert Manifest.load(tmp_path / "manifest.json").total_samples == 1


@pytest.mark.parametrize("sample", [{"__key__": "k"}, {"__key__": "k", "__url__": "x"}])
def test_a_sample_without_fields_is_refused(tmp_path: Path, sample: dict[str, Any]) -> None:
    with ShardWriter(tmp_path) as w, pytest.raises(WriterError, match="no fields"):
        w.write(sample)


def test_a_block_that_raises_leaves_no_temp_and_no_unfinished_shard(tmp_path: Path) -> None:
    samples = list(make_samples(12))
    with pytest.raises(RuntimeError, match="boom"), ShardWriter(tmp_path, maxcount=5) as w:
        for s in samples:
            w.write(s)
        raise RuntimeError("boom")
    names = sorted(os.listdir(tmp_path))
    assert not hidden_leftovers(tmp_path), names
    m = Manifest.load(tmp_path / "manifest.json")
    assert [e.nsamples for e in m.shards] == [5, 5]  # the 2-sample shard was dropped
    assert "data-000002.tar" not in names
    _assert_whole(tmp_path, m)


def test_the_manifest_on_disk_lists_only_whole_shards_at_every_step(tmp_path: Path) -> None:
    """Manifest and journal together list every finished shard, and only those."""
    with ShardWriter(tmp_path, maxcount=3) as w:
        for i, s in enumerate(make_samples(40)):
            w.write(s)
            path = tmp_path / "manifest.json"
            if path.exists():
                m = Manifest.load(path)
                journal = [e for e, _ in read_journal(str(path))]
                listed = {e.url for e in m.shards}
                m.shards += [e for e in journal if e.url not in listed]
                assert m.total_samples == 3 * (i // 3)
                _assert_whole(tmp_path, m)
                for e in m.shards:
                    assert e.index is not None
                    index = read_index((tmp_path / e.index).read_bytes())
                    assert len(index) == e.nsamples + 1
    assert Manifest.load(tmp_path / "manifest.json").total_samples == 40
    assert not os.path.exists(journal_path(str(tmp_path / "manifest.json")))


def test_the_manifest_is_rewritten_a_logarithmic_number_of_times(tmp_path: Path) -> None:
    """Finished shards go to the journal; the manifest is folded when the journal has grown
    as long as it: 1, 2, 4, 8, ... shards, so a build's rewrites cost O(shards) in all."""
    seen = []
    with ShardWriter(tmp_path, maxcount=1) as w:
        for s in make_samples(40):
            w.write(s)
            path = tmp_path / "manifest.json"
            if path.exists() and (not seen or len(Manifest.load(path)) != seen[-1]):
                seen.append(len(Manifest.load(path)))
    assert seen == [1, 2, 4, 8, 16, 32]
    assert len(Manifest.load(tmp_path / "manifest.json")) == 40


def test_resume_folds_the_journal_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path, maxcount=1)
    for s in make_samples(6):
        w.write(s)
    w.next_shard()  # six shards finished; the writer "dies" here: never closed
    journal = w.output._journal  # type: ignore[attr-defined]
    assert journal is not None
    journal.close()  # a killed process's files close with it
    w._lock.release()  # type: ignore[union-attr]  # and its output lock goes with it
    path = str(tmp_path / "manifest.json")
    assert len(Manifest.load(path)) == 4 and len(read_journal(path)) == 2
    with open(journal_path(path), "ab") as f:
        f.write(b'{"shard": {"url": "data-0000')  # a line cut short by the kill
    with ShardWriter(tmp_path, maxcount=1, resume=True) as again:
        assert again.resumed_samples == 6
        for s in make_samples(1, start=6):
            again.write(s)
    m = Manifest.load(path)
    assert [e.url for e in m.shards] == [f"data-{i:06d}.tar" for i in range(7)]
    assert m.fields["tokens.npy"]["count"] == 7
    _assert_whole(tmp_path, m)
    assert not os.path.exists(journal_path(path))


def test_stats_and_manifest_facts(tmp_path: Path) -> None:
    m = _write(tmp_path, list(make_samples(7, tokens=10)), maxcount=4)
    assert m.fields["tokens.npy"]["count"] == 7
    assert m.fields["tokens.npy"]["bytes"] == 7 * (128 + 40)
    assert m.total_bytes == sum(os.path.getsize(tmp_path / e.url) for e in m.shards)
    csv = (tmp_path / "manifest.csv").read_text().splitlines()
    assert csv[0] == "url,size,nsamples,checksum" and len(csv) == 3


def test_resume_keeps_finished_shards_and_continues_numbering(tmp_path: Path) -> None:
    _write(tmp_path, list(make_samples(6)), maxcount=3)
    with ShardWriter(tmp_path, maxcount=3, resume=True) as w:
        assert w.resumed_samples == 6
        for s in make_samples(2, start=6):
            w.write(s)
    m = Manifest.load(tmp_path / "manifest.json")
    assert [e.url for e in m.shards][-1] == "data-000002.tar"
    assert m.total_samples == 8


def test_closed_writer_refuses_writes(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path)
    w.close()
    with pytest.raises(WriterError, match="closed"):
        w.write({"__key__": "a", "txt": "x"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"maxsize": "1KB"},
        {"maxsize": "lots"},
        {"maxcount": 0},
        {"prefix": "a/b"},
        {"prefix": ""},
        {"compress": "bzip2"},
        {"image_quality": 0},
        {"checksum": "crc32"},
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ShardWriter(tmp_path, **kwargs)


def _dead_pid() -> int:
    """A pid no process has now (counting down from the top of the pid range)."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_stale_temps_of_dead_writers_are_removed_live_ones_kept(tmp_path: Path) -> None:
    dead_pid = _dead_pid()
    names = {
        f".data-000003.tar.tmp-{dead_pid}": False,  # its writer is gone: removed
        f".data-000004.tar.zst.tmp-{dead_pid}": False,
        f".data-000005.tar.tmp-{os.getppid()}": True,  # a live process: kept
        f".data-p0001-000000.tar.tmp-{dead_pid}": True,  # another prefix: kept
        "data-000009.tar": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"partial")
    # resume: without it a writer refuses the stray data-000009.tar (hostile/test_places_output)
    ShardWriter(tmp_path, resume=True).close()
    for name, kept in names.items():
        assert (tmp_path / name).exists() == kept, name
