"""Hostile values at entries the first values pass left: ``shuffle(bufsize, initial)``,
``pack_tokens(pad=None)`` and ``sk.verify``'s arguments.

``shuffle(True)`` and ``shuffle(float('inf'))`` shuffled no sample (a window of one: the
order of the shards, no error), ``shuffle(2.5)`` a window of 2; ``shuffle('3')`` was a bare
TypeError from a comparison. ``pack_tokens(pad=None)`` was a bare ``int(None)`` TypeError.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit as sk
from shardkit.errors import ConfigError


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = Path(tmp_path_factory.mktemp("extra")) / "set"
    with sk.ShardWriter(out, maxcount=8) as w:
        for i in range(16):
            w.write({"__key__": f"k{i:02d}", "tokens.npy": np.arange(i + 1, dtype=np.int32)})
    return str(out / "manifest.json")


@pytest.mark.parametrize(
    "bufsize", [True, np.bool_(True), 2.5, 4.0, float("inf"), float("nan"), 1e308, "3", None]
)
def test_shuffle_bufsize_is_an_integer(manifest: str, bufsize: Any) -> None:
    with pytest.raises(ConfigError, match="shuffle: bufsize"):
        sk.ShardDataset(manifest, seed=1).shuffle(bufsize)


@pytest.mark.parametrize("initial", [True, 2.5, "2", float("inf")])
def test_shuffle_initial_is_an_integer(manifest: str, initial: Any) -> None:
    with pytest.raises(ConfigError, match="shuffle: initial"):
        sk.ShardDataset(manifest, seed=1).shuffle(8, initial=initial)


def test_shuffle_takes_numpy_integers_and_shuffles(manifest: str) -> None:
    plain = [s["__key__"] for s in sk.ShardDataset(manifest, seed=1, shardshuffle=False)]
    mixed = [
        s["__key__"]
        for s in sk.ShardDataset(manifest, seed=1, shardshuffle=False).shuffle(np.int64(16))
    ]
    assert sorted(mixed) == plain and mixed != plain


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_pack_tokens_pad_none_is_named(manifest: str, strategy: str) -> None:
    with pytest.raises(ConfigError, match="pad must be an int"):
        sk.ShardDataset(manifest).decode().pack_tokens(
            "tokens.npy", 8, eos=0, pad=None, strategy=strategy
        )


@pytest.mark.parametrize("given", [None, 3, {"shards": []}, b"manifest.json", ["a"]])
def test_verify_names_what_it_takes(given: Any) -> None:
    with pytest.raises(TypeError, match="a path, a url or a Manifest"):
        sk.verify(given)


@pytest.mark.parametrize("jobs", ["2", 2.5, True, 0, -1, None])
def test_verify_jobs_is_a_count(manifest: str, jobs: Any) -> None:
    with pytest.raises(ConfigError, match="verify: jobs"):
        sk.verify(manifest, jobs=jobs)


def test_verify_takes_a_path_and_numpy_jobs(manifest: str) -> None:
    assert sk.verify(Path(manifest), jobs=np.int64(2)).ok


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """27 samples: a select refuses 6 (counted as filtered), decode skips 7 (bad json)."""
    out = Path(tmp_path_factory.mktemp("counted")) / "set"
    with sk.ShardWriter(out, maxcount=7) as w:
        for i in range(40):
            text = b"{bad" if i % 6 == 0 else b'{"i": %d}' % i
            w.write({"__key__": f"{i:04d}", "json": text})
    return str(out / "manifest.json")


def _kept(sample: dict[str, Any]) -> bool:
    return int(sample["__key__"]) % 5 != 1


def _key(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (2, "process"), (2, "thread")])
def test_a_dropped_short_batch_is_not_counted_as_delivered(
    counted: str, workers: int, mode: str
) -> None:
    """batched(partial=False) drops a short last batch: stats() said its samples reached
    the training loop (samples 27 for 24 delivered, dropped 0)."""
    ds = sk.ShardDataset(counted, shardshuffle=False, handler="warn").decode()
    ds = ds.select(_kept).map(_key).batched(4, collate=list, partial=False)
    loader = sk.WebLoader(ds, num_workers=workers, worker_mode=mode)
    got = [k for batch in loader for k in batch]
    st = loader.stats()
    assert st["samples"] == len(got) == 24
    assert st["filtered_samples"] == 6 and st["skipped_samples"] == 7
    assert st["dropped_samples"] == 27 - 24


def test_allow_pipe_false_as_a_string_never_runs_a_command(tmp_path: Path) -> None:
    """IoConfig(allow_pipe="false") (a config file's string) was truthy: pipe: urls ran."""
    out = tmp_path / "ran"
    with pytest.raises(ConfigError, match="allow_pipe must be True or False"):
        sk.io.IoConfig(allow_pipe="false")
    with pytest.raises(ConfigError, match="allow_pipe"):
        sk.ShardDataset(f"pipe:touch {out}", io=sk.io.IoConfig(allow_pipe="0"))
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", 2.5),
        ("max_attempts", float("nan")),
        ("max_attempts", float("inf")),
        ("prefetch_threads", 2.5),
        ("piece_parallel", float("inf")),
        ("max_member", float("nan")),
        ("range_size", True),
        ("backoff_base", "1"),
        ("read_timeout", None),
        ("rate_adapt", "false"),
        ("node_requests", float("nan")),
    ],
)
def test_io_options_hold_their_kind(option: str, value: Any) -> None:
    """Each was taken and failed (or misbehaved) only when a read used it."""
    own = {"retry": sk.io.RetryPolicy, "cache": sk.io.CacheConfig, "limits": sk.io.ReaderLimits}
    concern = [c for c, cls in own.items() if option in {f.name for f in dataclasses.fields(cls)}]
    with pytest.raises(ConfigError, match=option):
        if concern:
            sk.io.IoConfig(**{concern[0]: own[concern[0]](**{option: value})})
        else:
            sk.io.IoConfig(**{option: value})


def test_io_options_take_numpy_numbers_and_integral_floats() -> None:
    cfg = sk.io.IoConfig(
        range_size=1e6, retry=sk.io.RetryPolicy(max_attempts=np.int64(3), deadline=np.float32(9))
    )
    assert cfg.retry.max_attempts == 3 and type(cfg.range_size) is int and cfg.range_size == 10**6
