"""How a worker process's batch crosses its queue (issue 30): by plain pickle when it holds
only plain data and references into a slot the training process already has, by torch's
sharing pickler otherwise; and a worker reads its first batch before it is asked for it,
an error in that read still reaching the training loop, in the first epoch and a later one."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, WebLoader
from shardkit.errors import ShardkitError
from shardkit.streaming.arena import Lanes, Parcel, WorkerArena, take_over
from shardkit.streaming.transfer import InlineBatch, Pickled, deliver
from shardkit.streaming.workers import _primed
from shardkit.write.writer import ShardWriter


def _docs(i: int) -> dict[str, Any]:
    """A batch of 8 LLM documents as collate makes it: ragged tokens, a json column."""
    rng = np.random.default_rng(i)
    return {
        "__key__": [f"d{i}-{j}" for j in range(8)],
        "json": {"id": np.arange(8) + i, "url": [f"https://x/{i}/{j}" for j in range(8)]},
        "tokens.npy": [rng.integers(0, 1 << 20, size=n, dtype=np.int32) for n in range(300, 308)],
    }


def _cross(a: WorkerArena, batch: Any) -> tuple[Pickled, Any, Any]:
    """As a worker process sends it and the training process takes it over."""
    sent = a.crossing(batch)
    opened = pickle.loads(pickle.dumps(sent)).load()
    return sent, opened, take_over(opened)[0]


def _same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if type(got) is torch.Tensor:
        assert got.dtype == want.dtype and torch.equal(got, want)
    elif type(got) is dict:
        assert list(got) == list(want)
        for k in got:
            _same(got[k], want[k])
    elif type(got) is list:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        assert got == want


def test_plain_batches_cross_by_plain_pickle_once_their_slot_is_known() -> None:
    a = WorkerArena(Lanes(1), 0)
    kinds = []
    for i in range(4):
        sent, opened, got = _cross(a, _docs(i))
        kinds.append(type(opened).__name__)
        _same(got, deliver(_docs(i)))  # what threads and 0 workers hand out
        # a new slot's segment crosses by torch's sharing; after that, plain pickle
        assert (b"torch" in sent.data) == (i == 1), (i, kinds)
        del opened, got  # the slot released: the next batch reuses it
    assert kinds == ["InlineBatch", "Parcel", "Parcel", "Parcel"]


def test_a_tensor_or_an_object_left_in_a_batch_crosses_by_torchs_sharing() -> None:
    """A small tensor is not placed in the slot: it crosses by torch's sharing (its storage
    in shared memory), as an object that may hold one does; values as every mode gives."""
    a = WorkerArena(Lanes(1), 0)
    _cross(a, _docs(0))  # the first batch inline
    _cross(a, _docs(1))  # the slot's segment now known, and released
    small = torch.arange(4, dtype=torch.int64)
    sent, opened, got = _cross(a, {**_docs(2), "t": small})
    assert isinstance(opened, Parcel) and opened.segment is None
    assert opened.tree["t"].is_shared() and b"torch" in sent.data
    _same(got, deliver({**_docs(2), "t": small}))
    sent, _, got = _cross(a, {**_docs(3), "o": Path("x")})
    assert b"torch" in sent.data and got["o"] == Path("x")


def test_a_first_batch_crosses_whole_by_plain_pickle() -> None:
    a = WorkerArena(Lanes(1), 0)
    sent, opened, got = _cross(a, _docs(0))
    assert isinstance(opened, InlineBatch) and b"torch" not in sent.data
    _same(got, deliver(_docs(0)))


def test_primed_takes_the_first_item_now_and_raises_its_error_when_asked() -> None:
    seen: list[int] = []

    def items(fail: bool) -> Any:
        for i in range(3):
            if fail:
                raise ValueError("bad first item")
            seen.append(i)
            yield i

    it = _primed(items(False))
    assert seen == [0]  # read before it is asked for
    assert list(it) == [0, 1, 2] and seen == [0, 1, 2]
    failing = _primed(items(True))  # no error yet
    with pytest.raises(ValueError, match="bad first item"):
        next(failing)
    assert list(_primed(iter(()))) == []


def _shards(where: Path) -> str:
    with ShardWriter(where, maxsize="20KB") as w:
        for i in range(12):
            w.write({"__key__": f"{i:04d}", "tokens.npy": np.arange(100 + i, dtype=np.int32)})
    return str(where / "manifest.json")


@pytest.mark.timeout(60)
def test_an_error_in_a_later_epochs_first_read_reaches_the_training_loop(
    tmp_path: Path,
) -> None:
    """Kept worker processes read the next epoch's first batch as the epoch starts: a shard
    damaged between epochs is the reader's named error in the training loop, not a worker
    that died (torch's worker loop does not catch errors made with a later iterator)."""
    manifest = _shards(tmp_path)
    loader = WebLoader(ShardDataset(manifest).decode().batched(4), num_workers=1, timeout=30)
    assert sum(len(b["__key__"]) for b in loader) == 12
    for shard in sorted(tmp_path.glob("*.tar")):
        data = bytearray(shard.read_bytes())
        data[600] ^= 0xFF  # inside the first member's bytes: the checksum no longer holds
        shard.write_bytes(bytes(data))
    with pytest.raises(ShardkitError):
        list(loader)
