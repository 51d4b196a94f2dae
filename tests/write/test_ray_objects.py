"""ShardDatasink straight into an object store (moto's S3 server): Ray workers with no
shared disk write their shards into the bucket, the driver one manifest last; a failed job
leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray  # the optional extra shardkit[ray]; the test extra installs it

import shardkit as sk
from shardkit.cache import make_opener
from shardkit.errors import ConfigError
from shardkit.io import load_manifest
from tests.helpers.readback import read_samples
from tests.helpers.stores import Store, moto_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    """moto first, so the Ray workers start with its endpoint in their environment."""
    with moto_store() as s:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield s
        finally:
            ray.shutdown()


def _rows(n: int) -> list[dict[str, object]]:
    return [{"__key__": f"r{i:05d}", "txt": f"row {i}", "json": {"i": i}} for i in range(n)]


def test_ray_sink_writes_into_the_bucket(store: Store) -> None:
    from shardkit.ray import ShardDatasink

    ds = ray.data.from_items(_rows(200), override_num_blocks=4)
    ds.write_datasink(ShardDatasink(store.url("ray/"), maxcount=30))
    opener = make_opener()
    m = load_manifest(store.url("ray/manifest.json"), opener)
    assert m.total_samples == 200
    keys = sorted(str(s["__key__"]) for s in read_samples(m, opener))
    assert keys == [f"r{i:05d}" for i in range(200)]
    names = store.names()
    assert not [n for n in names if "ray-write" in n]  # the tasks' manifests are gone
    assert all(f"ray/{e.url}" in names for e in m.shards)
    ds2 = sk.ShardDataset(store.url("ray/manifest.json"))
    assert sum(1 for _ in ds2) == 200
    with pytest.raises(ConfigError, match="already holds a manifest"):
        ds.write_datasink(ShardDatasink(store.url("ray/"), maxcount=30))


def test_a_failed_ray_write_leaves_nothing(store: Store) -> None:
    from shardkit.ray import ShardDatasink

    def boom(row: dict[str, object]) -> dict[str, object]:
        if row["__key__"] == "r00150":
            raise ValueError("bad row")
        return row

    ds = ray.data.from_items(_rows(200), override_num_blocks=4).map(boom)
    with pytest.raises(Exception, match="bad row"):
        ds.write_datasink(ShardDatasink(store.url("failed/"), maxcount=30))
    assert not [n for n in store.names() if n.startswith("failed/")]
