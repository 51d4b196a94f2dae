"""Stages on real shards the tests write: source, decode, map/select/to_tuple, batched,
pack_tokens, mix, the bad-data policies, and the resume contract for every stateful stage."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, mix
from shardkit.errors import (
    ChecksumError,
    ConfigError,
    DecodeError,
    FetchError,
    StateDictError,
)
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.io import CacheConfig
from shardkit.io.config import IoConfig
from shardkit.write.writer import ShardWriter
from tests.helpers.resumable import assert_resumable

MakeShards = Callable[..., Manifest]
SIZES = [7, 11, 3, 9, 13, 10, 7]


def keys(items: Any) -> list[str]:
    return [s["__key__"] for s in items]


def key_id(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def shard_path(m: Manifest, i: int) -> str:
    return m.resolve(m.shards[i].url)


# -- the source ---------------------------------------------------------------------
def test_the_source_reads_every_sample_in_manifest_order(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    samples = list(ShardDataset(m, shardshuffle=False))
    assert [key_id(k) for k in keys(samples)] == list(range(60))
    first = samples[0]
    assert set(first) == {"__key__", "__url__", "json", "tokens.npy"}
    assert first["__url__"] == shard_path(m, 0) and isinstance(first["json"], bytes)


def test_manifest_path_url_list_and_brace_pattern_agree(make_shards: MakeShards) -> None:
    m = make_shards([4, 6, 5], prefix="part")
    base = os.path.dirname(shard_path(m, 0))
    by_manifest = keys(ShardDataset(os.path.join(base, "manifest.json"), shardshuffle=False))
    assert keys(ShardDataset(Path(base) / "manifest.json", shardshuffle=False)) == by_manifest
    urls = [shard_path(m, i) for i in range(3)]
    assert keys(ShardDataset(urls, shardshuffle=False)) == by_manifest
    pattern = os.path.join(base, "part-{000000..000002}.tar")
    assert keys(ShardDataset(pattern, shardshuffle=False)) == by_manifest
    for url in urls:  # without sample indexes the counts come from a scan
        os.unlink(index_name(url))
    assert keys(ShardDataset(urls, shardshuffle=False)) == by_manifest
    assert len(ShardDataset(urls).split_by_node(1, 2)) == 7


def test_ranks_split_shards_by_sample_range(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)
    seen: list[int] = []
    for rank in range(4):
        ds = ShardDataset(m, seed=3).split_by_node(rank, 4)
        got = [key_id(k) for k in keys(ds)]
        assert len(got) == len(ds) == 15
        seen += got
    assert sorted(seen) == list(range(60))


def test_unknown_io_options_fail_when_the_data_set_is_made(make_shards: MakeShards) -> None:
    with pytest.raises(ConfigError, match="range_sise"):
        ShardDataset(make_shards([2]), io=IoConfig(range_sise=10**6))
    with pytest.raises(ConfigError, match="IoConfig"):
        ShardDataset(make_shards([2]), io={"range_size": 1})  # type: ignore[arg-type]
    cfg = IoConfig(range_size=10**6, cache=CacheConfig(cache_dir="/tmp/y", cache_limit=2 * 10**9))
    with pytest.raises(ConfigError, match="not both"):
        ShardDataset(make_shards([2]), io=cfg, cache_dir="/tmp/x")
    ds = ShardDataset(make_shards([2]), io=IoConfig(range_size=10**6), cache_dir="c")
    assert (ds.sources[0].io.range_size, ds.sources[0].io.cache.cache_dir) == (1_000_000, "c")


def test_the_order_follows_seed_and_epoch(make_shards: MakeShards) -> None:
    m = make_shards(SIZES)

    def run(seed: int, epoch: int) -> list[str]:
        ds = ShardDataset(m, seed=seed).shuffle(20)
        ds.set_epoch(epoch)
        return keys(ds)

    a = run(1, 0)
    assert sorted(a) == sorted(keys(ShardDataset(m)))
    assert a == run(1, 0)
    assert a != run(1, 1) and a != run(2, 0)


def test_resampled_streams_have_the_epoch_length_asked(make_shards: MakeShards) -> None:
    m = make_shards([5, 5])
    ds = ShardDataset(m, resampled=True, seed=4).with_epoch(23)
    assert len(ds) == 23 and len(keys(ds)) == 23
    with pytest.raises(ConfigError, match="resampled"):
        ShardDataset(m).with_epoch(5)
    endless = iter(ShardDataset(m, resampled=True))
    assert len([next(endless) for _ in range(100)]) == 100
    with pytest.raises(TypeError):
        len(ShardDataset(m, resampled=True))


# -- decode, map, select, to_tuple, batched ----------------------------------------------
def _png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, format="PNG")
    return buf.getvalue()


def write_custom(out: Path, samples: list[dict[str, Any]]) -> Manifest:
    with ShardWriter(out, maxsize="1MB") as w:
        for s in samples:
            w.write(s)
    return Manifest.load(out / "manifest.json")


def test_decode_builtin_codecs_handlers_and_images(tmp_path: Path) -> None:
    m = write_custom(
        tmp_path,
        [
            {
                "__key__": f"k{i}",
                "png": _png((i, 2, 3)),
                "json": {"i": i},
                "txt": "hé",
                "cls": i,
                "raw.bin": b"\x00\x01",
                "odd.xyz": b"7",
            }
            for i in range(3)
        ],
    )
    (s,) = list(ShardDataset(m, shardshuffle=False).decode())[:1]
    assert s["json"] == {"i": 0} and s["txt"] == "hé" and s["cls"] == 0
    assert s["raw.bin"] == b"\x00\x01" and s["png"].size == (4, 3)
    rgb = next(iter(ShardDataset(m, shardshuffle=False).decode("rgb8")))["png"]
    assert rgb.dtype == np.uint8 and rgb.shape == (3, 4, 3) and tuple(rgb[0, 0]) == (0, 2, 3)
    custom = next(
        iter(
            ShardDataset(m).decode(
                {"xyz": lambda b: int(b) * 2}, lambda f, b: "seen" if f == "txt" else None
            )
        )
    )
    assert custom["odd.xyz"] == 14 and custom["txt"] == "seen"
    with pytest.raises(ConfigError):
        ShardDataset(m).decode("cmyk")


def test_pickle_is_refused_unless_allowed(tmp_path: Path) -> None:
    m = write_custom(tmp_path, [{"__key__": "a", "pyd": b"\x80\x04K\x07."}])
    with pytest.raises(DecodeError, match="unpickle"):
        list(ShardDataset(m).decode())
    assert next(iter(ShardDataset(m).decode(allow_pickle=True)))["pyd"] == 7


def test_map_select_to_tuple_and_batched(make_shards: MakeShards) -> None:
    m = make_shards([10, 6])
    ds = (
        ShardDataset(m, shardshuffle=False)
        .decode()
        .select(lambda s: s["json"]["id"] % 2 == 0)
        .map(lambda s: {**s, "double": s["json"]["id"] * 2})
        .to_tuple("missing;double", "tokens.npy", "__key__")
        .batched(3)
    )
    batches = list(ds)
    assert [len(b[0]) for b in batches] == [3, 3, 2]
    doubles, tokens, names = batches[0]
    assert isinstance(doubles, np.ndarray) and doubles.tolist() == [0, 4, 8]
    assert tokens.shape == (3, 64) and tokens.dtype == np.int32
    assert names == ["sample-00000000", "sample-00000002", "sample-00000004"]
    with pytest.raises(TypeError):
        len(ds)
    full = ShardDataset(m).to_tuple("json").batched(5, partial=False)
    assert len(full) == 3 and len(list(full)) == 3
    as_torch = ShardDataset(m).decode().to_tuple("tokens.npy").batched(4, collate="torch")
    assert isinstance(next(iter(as_torch))[0], torch.Tensor)
    with pytest.raises(DecodeError, match="nope"):
        list(ShardDataset(m).to_tuple("nope"))
    with pytest.raises(ConfigError):
        ShardDataset(m).batched(2).shuffle(10)


def test_pack_tokens_cuts_the_token_stream_exactly(make_shards: MakeShards) -> None:
    m = make_shards([3, 4], tokens=50)
    docs = [s["tokens.npy"] for s in ShardDataset(m, shardshuffle=False).decode()]
    stream = np.concatenate([np.append(d, -1) for d in docs])
    seqs = list(ShardDataset(m, shardshuffle=False).decode().pack_tokens("tokens.npy", 64, eos=-1))
    assert len(seqs) == len(stream) // 64
    assert np.array_equal(np.concatenate(seqs), stream[: 64 * len(seqs)])
    with pytest.raises(DecodeError, match="decode"):
        list(ShardDataset(m).pack_tokens("tokens.npy", 8))


def test_mix_is_weighted_seeded_and_longest_reads_all(make_shards: MakeShards) -> None:
    a, b = make_shards([200]), make_shards([200], prefix="other")

    def run(seed: int, longest: bool = False) -> list[str]:
        ds = mix([ShardDataset(a), ShardDataset(b)], [0.8, 0.2], seed=seed, longest=longest)
        return [s["__url__"].rsplit("/", 1)[1][:4] for s in ds]

    picks = run(1)
    assert picks == run(1) and picks != run(2)
    assert len(picks) < 260 and 0.7 < picks.count("data") / len(picks) < 0.9
    assert sorted(set(run(1, longest=True))) == ["data", "othe"]
    assert len(run(1, longest=True)) == 400
    with pytest.raises(ConfigError):
        mix([ShardDataset(a)], [1, 2])


# -- bad data -----------------------------------------------------------------------
@pytest.fixture
def damaged(make_shards: MakeShards) -> Manifest:
    """Shard 1 of 3 is truncated mid-way, shard 2 is missing."""
    m = make_shards([5, 6, 4])
    path = shard_path(m, 1)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    os.unlink(shard_path(m, 2))
    return m


def test_raise_policy_names_the_shard(damaged: Manifest) -> None:
    # a shard cut short is found by verification (issue 20: local shards are verified)
    # before the tar reader reaches the cut
    with pytest.raises(ChecksumError, match="data-000001"):
        list(ShardDataset(damaged, shardshuffle=False))
    with pytest.raises(FetchError, match="data-000002"):
        list(ShardDataset([shard_path(damaged, 2)]))


@pytest.mark.parametrize("handler", ["warn", "warn_and_continue", "skip_shard"])
def test_skipping_policies_count_what_they_drop(
    damaged: Manifest, handler: str, caplog: pytest.LogCaptureFixture
) -> None:
    ds = ShardDataset(damaged, shardshuffle=False, handler=handler)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        got = keys(ds)
    assert got[:5] == [f"sample-{i:08d}" for i in range(5)]
    assert 5 <= len(got) < 11 and all(key_id(k) < 11 for k in got)
    counters = ds.counters()
    assert counters["skipped_shards"] == 2
    assert counters["skipped_samples"] == 15 - len(got)
    assert "data-000002" in caplog.text


@pytest.mark.parametrize(("handler", "kept"), [("warn", 5), ("skip_shard", 2)])
def test_decode_errors_follow_the_policy(tmp_path: Path, handler: str, kept: int) -> None:
    samples = [{"__key__": f"k{i}", "json": b"{bad" if i == 2 else b"1"} for i in range(6)]
    m = write_custom(tmp_path, samples)
    with pytest.raises(DecodeError, match="k2"):
        list(ShardDataset(m, shardshuffle=False).decode())
    ds = ShardDataset(m, shardshuffle=False, handler=handler).decode()
    assert len(list(ds)) == kept
    assert ds.counters()["skipped_samples"] == 6 - kept


# -- the resume contract, for every stateful stage ------------------------------------
def pipelines(m: Manifest, other: Manifest) -> dict[str, Callable[[], ShardDataset]]:
    return {
        "source": lambda: ShardDataset(m, seed=1),
        "source-by-rank": lambda: ShardDataset(m, seed=1).split_by_node(2, 3),
        "shuffle": lambda: ShardDataset(m, seed=1).shuffle(16, initial=4),
        "resampled": lambda: ShardDataset(m, seed=2, resampled=True).shuffle(8).with_epoch(45),
        "batched": lambda: ShardDataset(m, seed=1).shuffle(9).to_tuple("__key__").batched(4),
        "select": lambda: ShardDataset(m).shuffle(5).select(lambda s: s["__key__"][-1] in "1357"),
        "pack_tokens": lambda: (
            ShardDataset(m, seed=3).shuffle(7).decode().pack_tokens("tokens.npy", 100, eos=0)
        ),
        "mix": lambda: mix([ShardDataset(m).shuffle(6), ShardDataset(other, seed=5)], [2, 1]),
        "mix-longest": lambda: (
            mix([ShardDataset(m), ShardDataset(other).shuffle(4)], seed=4, longest=True)
            .to_tuple("__key__")
            .batched(3)
        ),
    }


PIPELINES = [
    "source",
    "source-by-rank",
    "shuffle",
    "resampled",
    "batched",
    "select",
    "pack_tokens",
    "mix",
    "mix-longest",
]


@pytest.mark.parametrize("name", PIPELINES)
def test_every_stateful_stage_resumes_exactly(make_shards: MakeShards, name: str) -> None:
    m, other = make_shards(SIZES), make_shards([9, 4, 8], prefix="other")
    make = pipelines(m, other)[name]
    assert_resumable(make, rounds=4, seed=len(name), prepare=lambda d: d.set_epoch(3))


def test_states_that_do_not_fit_are_refused(make_shards: MakeShards) -> None:
    """Every unfit state is a StateDictError naming the field, never silent wrong data."""
    m = make_shards(SIZES)
    twin = make_shards(SIZES, seed=5)  # same shard count, sizes and counts; other content
    assert [s.size for s in twin.shards] == [s.size for s in m.shards]
    ds = ShardDataset(m, seed=1).shuffle(10)
    it = iter(ds)
    for _ in range(7):
        next(it)
    state = ds.state_dict()
    assert json.loads(json.dumps(state)) == state
    inner = state["state"]
    refused: list[tuple[Callable[[], ShardDataset], dict[str, Any], str]] = [
        (lambda: ShardDataset(m, seed=2).shuffle(10), state, "'seed' is 1 in the state, 2"),
        (lambda: ShardDataset(m, seed=1).shuffle(50), state, "'bufsize' is 10 in the state, 50"),
        (lambda: ShardDataset(m, seed=1), state, "'bufsize' is 10 in the state, None"),
        (lambda: ShardDataset(twin, seed=1).shuffle(10), state, "'manifest'"),
        (lambda: ShardDataset(m, seed=1).shuffle(10).batched(4), state, "stages"),
        (lambda: ShardDataset(m, seed=1).shuffle(10).split_by_node(0, 2), state, "split_by_node"),
        (lambda: ShardDataset(m, seed=1).shuffle(10), {**state, "version": 99}, "version"),
        (lambda: ShardDataset(m, seed=1).shuffle(10), {**state, "epoch": -1}, "'epoch'"),
        (lambda: ShardDataset(m, seed=1).shuffle(10), {**state, "epoch": True}, "'epoch'"),
    ]
    for last in (10**9, -7, inner["last"] + 1):
        bad = {**state, "state": {**inner, "last": last}}
        refused.append((lambda: ShardDataset(m, seed=1).shuffle(10), bad, "'last'"))
    for pos in (10**9, -1, 2.5):
        bad = {**state, "state": {**inner, "position": pos}}
        refused.append((lambda: ShardDataset(m, seed=1).shuffle(10), bad, "'position'"))
    bad = {
        **state,
        "state": {**inner, "history": [{"world": 1, "workers": 1, "positions": [[-3]]}]},
    }
    refused.append((lambda: ShardDataset(m, seed=1).shuffle(10), bad, "history"))
    for make, st, field in refused:
        with pytest.raises(StateDictError, match=re.escape(field)):
            make().load_state_dict(st)
    # an epoch mismatch raises unless the user says to discard the state
    resumed = ShardDataset(m, seed=1).shuffle(10)
    resumed.load_state_dict(state)
    with pytest.raises(StateDictError, match="epoch 0"):
        resumed.set_epoch(1)
    tail = keys(resumed)
    assert len(tail) == sum(SIZES) - 7, "the failed set_epoch lost the state"
    fresh = ShardDataset(m, seed=1).shuffle(10)
    fresh.load_state_dict(state, epoch_mismatch="discard")
    fresh.set_epoch(1)
    assert len(keys(fresh)) == sum(SIZES)


def test_a_state_saved_after_the_epoch_fits_that_epoch_and_the_next(
    make_shards: MakeShards,
) -> None:
    m = make_shards(SIZES)
    ds = ShardDataset(m, seed=1).shuffle(10)
    ds.set_epoch(2)
    everything = keys(ds)
    state = ds.state_dict()
    assert state["complete"] and state["epoch"] == 2
    same = ShardDataset(m, seed=1).shuffle(10)
    same.load_state_dict(state)
    assert keys(same) == [], "epoch 2 had ended: nothing is left of it"
    nxt = ShardDataset(m, seed=1).shuffle(10)
    nxt.load_state_dict(state)
    nxt.set_epoch(3)
    epoch3 = keys(nxt)
    assert sorted(epoch3) == sorted(everything) and epoch3 != everything
    later = ShardDataset(m, seed=1).shuffle(10)
    later.load_state_dict(state)
    with pytest.raises(StateDictError, match="epoch 2 \\(ended\\), not epoch 4"):
        later.set_epoch(4)


def test_fluent_methods_return_new_pipelines(make_shards: MakeShards) -> None:
    """Two pipelines built from one base share no stage (webdataset's compose semantics)."""
    m = make_shards(SIZES)
    base = ShardDataset(m, seed=1)
    shuffled = base.shuffle(20)
    ranked = base.split_by_node(1, 2)
    assert base.sources[0].config.bufsize is None and not base.sources[0].config.by_node
    assert shuffled.sources[0].config.bufsize == 20 and not shuffled.sources[0].config.by_node
    assert ranked.sources[0].config.by_node and ranked.sources[0].config.bufsize is None
    assert len(ranked) == sum(SIZES) // 2 and len(base) == sum(SIZES)
    a, b = base.select(lambda s: True), base.to_tuple("__key__")
    assert a.pipeline() is not b.pipeline() and a.pipeline().upstream is not b.pipeline().upstream


def _npy(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version, allow_pickle=True)
    return buf.getvalue()


def test_npy_fields_decode_like_numpy_with_cached_headers(tmp_path: Path) -> None:
    arrays = [
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.array(7, dtype=np.uint16),
        np.zeros((0, 5), dtype=np.int8),
        np.arange(5, dtype=">i8"),
    ]
    samples = [{"__key__": f"a{i}", "x.npy": _npy(a)} for i, a in enumerate(arrays)]
    samples += [{"__key__": f"b{i}", "x.npy": _npy(a, (2, 0))} for i, a in enumerate(arrays)]
    samples.append({"__key__": "c0", "x.npy": _npy(np.arange(3, dtype=np.int32))})
    m = write_custom(tmp_path, samples)
    got = [s["x.npy"] for s in ShardDataset(m, shardshuffle=False).decode()]
    for a, b in zip([*arrays, *arrays, np.arange(3, dtype=np.int32)], got, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        assert b.flags.writeable
    bad = write_custom(
        tmp_path / "bad",
        [
            {"__key__": "obj", "x.npy": _npy(np.array([{"a": 1}], dtype=object))},
            {"__key__": "short", "x.npy": _npy(np.arange(100, dtype=np.int64))[:-8]},
            {"__key__": "junk", "x.npy": b"not an array at all"},
        ],
    )
    ds = ShardDataset(bad, shardshuffle=False, handler="warn").decode()
    assert list(ds) == [] and ds.counters()["skipped_samples"] == 3
    with pytest.raises(DecodeError, match=r"obj.*pickle"):
        list(ShardDataset(bad, shardshuffle=False).decode())


def test_decoding_without_images_never_imports_pillow(make_shards: MakeShards) -> None:
    """Pillow is imported at the first image decoded: a token data set never pays for it
    (its import was most of a worker process's time to its first batch)."""
    m = make_shards([6])
    script = (
        "import sys, shardkit\n"
        f"ds = shardkit.ShardDataset({os.path.join(str(m.base), 'manifest.json')!r}).decode()\n"
        "n = sum(1 for s in ds if s['tokens.npy'].dtype.kind == 'i')\n"
        "print(n, 'PIL' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["6", "False"]
