"""shardkit on Ray Data, on a local Ray (ray.init(num_cpus=2)): ShardDatasink writes shards
from every block and one manifest; ray.data.read_webdataset and shardkit read each other."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray  # the optional extra shardkit[ray]; the test extra installs it

import shardkit as sk
from shardkit.format.codecs import decode_field
from tests.helpers.data import make_shards
from tests.helpers.readback import assert_whole, keys_of, read_samples, shardkit

# Ray's DataContext warns about its own deprecated settings when it is created
pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "__key__": f"r{i:05d}",
            "jpg": bytes([i % 256]) * 30,
            "json": {"i": i},
            "tokens.npy": np.arange(i % 7, dtype=np.int32),
        }
        for i in range(n)
    ]


def test_shard_datasink_writes_every_block_and_one_manifest(
    local_ray: None, tmp_path: Path
) -> None:
    from shardkit.ray import ShardDatasink

    ds = ray.data.from_items(_rows(300), override_num_blocks=5)
    sink = ShardDatasink(tmp_path / "out", maxcount=40, checksum="xxh3_128")
    ds.write_datasink(sink)
    m = assert_whole(tmp_path / "out" / "manifest.json")
    assert [s.url for s in m.shards] == [f"data-{i:06d}.tar" for i in range(len(m))]
    assert m.total_samples == 300 and all(s.nsamples <= 40 for s in m.shards)
    samples = read_samples(tmp_path / "out" / "manifest.json")
    assert sorted(keys_of(samples)) == [f"r{i:05d}" for i in range(300)]
    s = next(x for x in samples if x["__key__"] == "r00009")
    assert s["jpg"] == bytes([9]) * 30
    assert decode_field("r00009", "tokens.npy", s["tokens.npy"]).tolist() == list(range(2))
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".ray-write-")]
    deep = shardkit("verify", tmp_path / "out" / "manifest.json", "--deep")
    assert deep.returncode == 0, deep.stdout + deep.stderr


def _explode(row: dict[str, object]) -> dict[str, object]:
    if row["__key__"] == "r00150":
        raise RuntimeError("a bad row")
    return row


def test_a_failed_job_leaves_no_manifest_and_no_shards(local_ray: None, tmp_path: Path) -> None:
    from shardkit.ray import ShardDatasink

    ds = ray.data.from_items(_rows(200), override_num_blocks=4).map(_explode)
    with pytest.raises(Exception, match="a bad row"):
        ds.write_datasink(ShardDatasink(tmp_path / "out", maxcount=20))
    assert os.listdir(tmp_path / "out") == []


def test_ray_reads_shardkit_shards(local_ray: None, tmp_path: Path) -> None:
    m = make_shards(tmp_path / "s", [5, 7])
    paths = [str(tmp_path / "s" / s.url) for s in m.shards]
    rows = ray.data.read_webdataset(paths, decoder=None).take_all()
    assert sorted(r["__key__"] for r in rows) == sorted(
        keys_of(read_samples(tmp_path / "s" / "manifest.json"))
    )


def test_shardkit_reads_ray_write_webdataset(local_ray: None, tmp_path: Path) -> None:
    rows = [{"__key__": f"k{i:04d}", "txt": f"text {i}", "cls": str(i)} for i in range(50)]
    ray.data.from_items(rows, override_num_blocks=2).write_webdataset(str(tmp_path / "w"))
    tars = sorted(str(p) for p in (tmp_path / "w").glob("*.tar"))
    assert tars
    got = [s for t in tars for s in sk.read_shard(t)]
    assert sorted(str(s["__key__"]) for s in got) == [f"k{i:04d}" for i in range(50)]
    assert {s["txt"] for s in got if s["__key__"] == "k0007"} == {b"text 7"}


def test_a_second_job_into_one_output_is_refused_and_the_first_survives(tmp_path: Path) -> None:
    """Two jobs' drivers (here: two threads) start sinks into one folder: the second is
    refused while the first writes, naming it; the first job's output is whole."""
    from shardkit.errors import WriterError
    from shardkit.ray import ShardDatasink

    first, second = ShardDatasink(tmp_path / "out"), ShardDatasink(tmp_path / "out")
    first.on_write_start()
    refused: list[BaseException] = []

    def start() -> None:
        try:
            second.on_write_start()
        except WriterError as exc:
            refused.append(exc)

    t = threading.Thread(target=start)
    t.start()
    t.join()
    assert len(refused) == 1 and "being written by another" in str(refused[0])
    import pyarrow as pa

    first.write([pa.table({"__key__": ["a"], "txt": ["x"]})], type("Ctx", (), {"task_idx": 0})())
    first.on_write_complete([{"task": 0, "samples": 1}])
    assert keys_of(read_samples(tmp_path / "out" / "manifest.json")) == ["a"]
