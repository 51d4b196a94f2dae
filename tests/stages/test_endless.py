"""Endless pipelines that have nothing to give end with a named error, never a spin, and
never fewer items than the length they promised (issue 29, class 6)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader, mix
from shardkit.errors import ConfigError, ShardError
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]


def never(sample: dict[str, Any]) -> bool:
    return False


def rarely(sample: dict[str, Any]) -> bool:
    return str(sample["__key__"]).endswith("7")


@pytest.mark.timeout(20)
def test_a_resampled_source_filtered_to_nothing_is_an_error_not_a_spin(
    make_shards: MakeShards,
) -> None:
    ds = ShardDataset(make_shards([5, 5]), resampled=True, seed=1).select(never)
    with pytest.raises(ConfigError, match=r"select\(.*never\) dropped all 1000 samples"):
        next(iter(ds))
    batched = ds.batched(2).with_epoch(3)  # a nominal epoch over it: the same error
    with pytest.raises(ConfigError, match="dropped all"):
        list(WebLoader(batched))


@pytest.mark.timeout(20)
def test_a_rare_but_present_sample_is_found_however_long_the_drought(
    make_shards: MakeShards,
) -> None:
    ds = ShardDataset(make_shards([40, 40]), resampled=True, seed=1).select(rarely)
    got = [s["__key__"] for _, s in zip(range(30), ds, strict=False)]
    assert len(got) == 30 and all(k.endswith("7") for k in got)


def test_an_endless_mixture_with_nothing_in_it_does_not_give_fewer_batches_than_its_length(
    make_shards: MakeShards,
) -> None:
    empty = [ShardDataset(make_shards([0]), seed=1), ShardDataset(make_shards([0, 0]), seed=2)]
    ds = mix(empty, [1, 1], stop="never").batched(2).with_epoch(6)
    loader = WebLoader(ds)
    assert len(loader) == 6
    with pytest.raises(ConfigError, match=r"with_epoch\(6\): the endless pipeline ran out"):
        list(loader)


@pytest.mark.timeout(20)
def test_a_resampled_source_whose_every_shard_fails_is_an_error_not_a_spin(
    make_shards: MakeShards,
) -> None:
    m = make_shards([5, 5, 5])
    for shard in m.shards:  # same size, other bytes: every read fails its checksum
        path = Path(str(m.base)) / shard.url
        data = bytearray(path.read_bytes())
        data[600:700] = b"\xff" * 100
        path.write_bytes(bytes(data))
    ds = ShardDataset(m, resampled=True, handler="skip_shard", seed=1)
    with pytest.raises(ShardError, match="skipped 1000 samples in a row of an endless"):
        next(iter(ds))
