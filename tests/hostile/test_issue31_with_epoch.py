"""Hostile review of issue 31: with_epoch(n) over a finite budget pipeline promises n batches
a rank (len() known), and a pipeline that runs out first is a named error, never fewer."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards


def nominal(m: Manifest, n: int) -> WebLoader:
    ds = ShardDataset(m, seed=3).decode()
    return WebLoader(ds.batched(budget=1500, cost="tokens.npy", buffer=30).with_epoch(n))


def test_with_epoch_over_a_finite_budget_pipeline_gives_n_or_a_named_error(
    tmp_path: Path,
) -> None:
    m = lognormal_shards(tmp_path / "d", n=200, shards=4)
    short = nominal(m, 10)  # the data holds more: 10 batches, known up front
    assert len(short) == 10 and len(list(short)) == 10
    long = nominal(m, 1000)  # it gave fewer batches than n with no error, len() unknown
    assert len(long) == 1000
    with pytest.raises(ConfigError, match=r"with_epoch\(1000\): the pipeline ran out after"):
        list(long)
