"""What a new user expects of the streaming API: clear refusals and sensible defaults."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import webdataset as wds

import shardkit as sk
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]


def _keys(ds: sk.ShardDataset) -> list[str]:
    return [s["__key__"] for s in ds]


def test_indexing_a_shard_dataset_points_at_indexed_shards(make_shards: MakeShards) -> None:
    m = make_shards([4, 4])
    with pytest.raises(TypeError, match=r"sk\.IndexedShards\(manifest\)"):
        sk.ShardDataset(m)[3]
    assert sk.IndexedShards(m)[3]["__key__"] == "sample-00000003"


def test_shuffle_without_a_buffer_size_takes_a_default(make_shards: MakeShards) -> None:
    m = make_shards([1500, 1500])
    plain = sk.ShardDataset(m, shardshuffle=False)
    shuffled = plain.shuffle()
    assert shuffled.sources[0].config.bufsize == 1000
    got = _keys(shuffled)
    assert sorted(got) == _keys(plain) and got != _keys(plain)
    assert got == _keys(plain.shuffle(1000)), "the default is shuffle(1000)"


def test_webdatasets_handler_functions_are_taken(make_shards: MakeShards) -> None:
    m = make_shards([3])
    for fn, policy in (
        (wds.reraise_exception, "raise"),
        (wds.warn_and_continue, "warn"),
        (wds.ignore_and_continue, "warn"),
    ):
        assert sk.ShardDataset(m, handler=fn).sources[0].policy == policy
    with pytest.raises(ConfigError, match="ignore_and_continue"):
        sk.ShardDataset(m, handler=print)


def test_remaining_tells_the_batches_left_after_a_resume(make_shards: MakeShards) -> None:
    m = make_shards([7, 9, 4])

    def loader() -> sk.WebLoader:
        ds = sk.ShardDataset(m, seed=2).shuffle(5).batched(3)
        return sk.WebLoader(ds, num_workers=2, multiprocessing_context="fork")

    first = loader()
    assert len(first) == first.remaining() == 8  # 2 workers: 10 + 10 samples -> 4 + 4
    it = iter(first)
    head = [next(it) for _ in range(3)]
    assert first.remaining() == 5
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert len(resumed) == 8 and resumed.remaining() == 5
    rest = list(resumed)
    assert len(rest) == 5 and len(head) + len(rest) == 8
    assert resumed.remaining() == 0
    at_end = resumed.state_dict()
    resumed.set_epoch(1)
    assert resumed.remaining() == 8
    ended = loader()
    ended.load_state_dict(at_end)
    assert ended.remaining() == 0, "the state's epoch had ended"
    ended.set_epoch(1)
    assert ended.remaining() == 8, "a state saved at the end of epoch 0 starts epoch 1 whole"
