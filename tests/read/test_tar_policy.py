"""The tar policy reaches every reader a user has:
``IoConfig(limits=ReaderLimits(tar_policy=...))``.

A foreign shard holding a symbolic link, a FIFO, a character device (written by tarfile)
and a member of the unknown type ``Q`` (a hand-made header with data): the default
``"strict"`` policy refuses it naming the shard and the link's offset, through
``ShardDataset``, ``WebLoader`` workers, ``IndexedShards``, a shard list and the cache
over HTTP; ``"lenient"`` reads every regular member, the samples webdataset gives for the
same tar, with the skipped members counted and warned naming the shard.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from shardkit import IndexedShards, ShardDataset, ShardFormatError, WebLoader, read_shard
from shardkit.check.summary import manifest_from_shards
from shardkit.format.manifest.compact import save_manifest
from shardkit.io import CacheConfig, ReaderLimits
from shardkit.io.config import IoConfig
from tests.helpers.servers import RangeServer
from tests.helpers.tarcorpus import (
    SPECIAL_KINDS,
    plain_sample,
    sorted_samples,
    special_members_tar,
    webdataset_samples,
)

LENIENT = IoConfig(limits=ReaderLimits(tar_policy="lenient"))
NSAMPLES = 10


@pytest.fixture
def foreign(tmp_path: Path) -> tuple[Path, Path, int]:
    """The shard, a manifest made for it under the lenient policy, the link's offset."""
    shard = tmp_path / "set" / "foreign-000000.tar"
    shard.parent.mkdir()
    at = special_members_tar(shard, NSAMPLES)
    m, path = manifest_from_shards(str(shard.parent), tar_policy="lenient")
    save_manifest(m, path)
    assert m.total_samples == NSAMPLES
    return shard, Path(path), at


def _refused(exc: pytest.ExceptionInfo[ShardFormatError], at: int) -> None:
    assert "foreign-000000.tar" in str(exc.value) and exc.value.offset == at, exc.value
    assert "symbolic link" in str(exc.value) and "--tar-policy lenient" in str(exc.value)


@pytest.mark.timeout(60)
def test_a_manifest_of_foreign_shards_is_refused_strict_and_counts_what_lenient_skips(
    foreign: tuple[Path, Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    shard, _, at = foreign
    with pytest.raises(ShardFormatError) as info:
        manifest_from_shards(str(shard.parent))
    _refused(info, at)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        got = list(read_shard(shard, policy="lenient"))
    assert sorted_samples(got) == sorted_samples(webdataset_samples(shard))
    assert len(got) == NSAMPLES
    summary = [r.getMessage() for r in caplog.records if "skipped 4 members" in r.getMessage()]
    assert len(summary) == 1 and str(shard) in summary[0], caplog.text


@pytest.mark.timeout(60)
def test_shard_dataset_honours_the_io_config(foreign: tuple[Path, Path, int]) -> None:
    shard, manifest, at = foreign
    with pytest.raises(ShardFormatError) as info:
        list(ShardDataset(str(manifest), shardshuffle=False))
    _refused(info, at)
    ds = ShardDataset(str(manifest), shardshuffle=False, io=LENIENT)
    assert sorted_samples(list(ds)) == sorted_samples(webdataset_samples(shard))
    # a shard named without a manifest or index: counted by a read under the policy
    bare = shard.parent.parent / "bare" / shard.name
    bare.parent.mkdir()
    shutil.copyfile(shard, bare)
    with pytest.raises(ShardFormatError) as info:
        list(ShardDataset([str(bare)], shardshuffle=False))
    _refused(info, at)
    listed = ShardDataset([str(bare)], shardshuffle=False, io=LENIENT)
    assert sorted_samples(list(listed)) == sorted_samples(webdataset_samples(shard))


@pytest.mark.timeout(60)
def test_the_reader_counts_what_it_skipped(foreign: tuple[Path, Path, int]) -> None:
    _, manifest, _ = foreign
    ds = ShardDataset(str(manifest), shardshuffle=False, io=LENIENT)
    assert len(list(ds)) == NSAMPLES
    counts = ds.counters()
    assert counts["skipped_members"] == sum(SPECIAL_KINDS.values()), counts


@pytest.mark.timeout(120)
def test_the_policy_survives_pickling_into_two_spawned_loader_workers(
    foreign: tuple[Path, Path, int],
) -> None:
    shard, manifest, _ = foreign
    ds = ShardDataset(str(manifest), shardshuffle=False, io=LENIENT)
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="spawn")
    got = list(loader)
    assert loader.stats()["skipped_members"] == sum(SPECIAL_KINDS.values())
    assert sorted_samples(got) == sorted_samples(webdataset_samples(shard))
    strict = WebLoader(
        ShardDataset(str(manifest), shardshuffle=False), num_workers=2,
        multiprocessing_context="fork",
    )  # fmt: skip
    with pytest.raises(ShardFormatError) as info:
        list(strict)
    # torch re-raises a worker's error as text: the shard and the member's offset in it
    assert "foreign-000000.tar at byte " in str(info.value), info.value
    assert "--tar-policy lenient" in str(info.value)


@pytest.mark.timeout(60)
def test_indexed_shards_honour_the_io_config(foreign: tuple[Path, Path, int]) -> None:
    shard, manifest, at = foreign
    want = sorted_samples(webdataset_samples(shard))
    strict = IndexedShards(str(manifest))
    with pytest.raises(ShardFormatError) as info:
        strict[2]  # sample 2 holds the link
    _refused(info, at)
    lenient = IndexedShards(str(manifest), io=LENIENT)
    assert sorted_samples([lenient[i] for i in range(NSAMPLES)]) == want
    assert plain_sample(lenient.get("s008")) == want[8]


@pytest.mark.timeout(60)
def test_the_cache_path_over_http_honours_the_io_config(
    foreign: tuple[Path, Path, int], tmp_path: Path
) -> None:
    shard, _, at = foreign
    with RangeServer(shard.parent.parent) as srv:
        url = srv.url("set/manifest.json")
        strict = IoConfig(cache=CacheConfig(cache_dir=tmp_path / "c1"))
        with pytest.raises(ShardFormatError) as info:
            list(ShardDataset(url, shardshuffle=False, io=strict))
        assert info.value.offset == at and "foreign-000000.tar" in str(info.value)
        cached = IoConfig(
            cache=CacheConfig(cache_dir=tmp_path / "c2"), limits=ReaderLimits(tar_policy="lenient")
        )
        got = list(ShardDataset(url, shardshuffle=False, io=cached))
    assert sorted_samples(got) == sorted_samples(webdataset_samples(shard))
    assert any((tmp_path / "c2").rglob("*")), "the shard went through the cache"


def test_an_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="tar_policy must be one of"):
        IoConfig(limits=ReaderLimits(tar_policy="loose"))
