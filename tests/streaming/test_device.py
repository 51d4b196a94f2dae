"""to_device: a batch's tensors moved with one copy per buffer they share, the same values,
types and layouts as moving each tensor, and nothing shared with the batch it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, ShardWriter, WebLoader, to_device
from shardkit.streaming.transfer import PackedBytes


def _storages(ts: list[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ts}


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, list | tuple):
        return [t for v in x for t in _tensors(v)]
    return []


def _same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride() and torch.equal(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        assert got is want


@pytest.mark.integration
def test_a_worker_batch_of_token_views_moves_as_one_copy(tmp_path: Path) -> None:
    """LLM documents through 2 worker processes, pinned where this build can pin: a batch's
    8 token arrays (views of one buffer, after each worker's first batch, which crosses
    whole) come out as 8 views of ONE new buffer, equal to the batch, sharing nothing with
    it; the json column and keys are untouched."""
    rng = np.random.default_rng(5)
    with ShardWriter(tmp_path, maxsize="200KB") as w:
        for i in range(64):
            tokens = rng.integers(0, 50_000, size=int(rng.integers(20, 400)), dtype=np.int32)
            w.write(
                {"__key__": f"d{i:04d}", "json": {"id": i, "n": len(tokens)}, "tokens.npy": tokens}
            )
    ds = ShardDataset(tmp_path / "manifest.json").decode().batched(8)
    loader = WebLoader(ds, num_workers=2, pin_memory=torch.cuda.is_available())
    seen = shared = 0
    for batch in loader:
        toks = batch["tokens.npy"]
        shared += len(_storages(toks)) == 1
        moved = to_device(batch, "cpu", copy=True)
        _same(moved, batch)
        got = moved["tokens.npy"]
        assert len(_storages(got)) == len(_storages(toks))  # a copy per buffer
        assert _storages(got).isdisjoint(_storages(_tensors(batch)))
        got[0][0] = -1  # the copy is its own: the batch keeps its values
        assert toks[0][0] != -1
        assert moved["__key__"] is batch["__key__"]
        seen += len(batch["__key__"])
    assert seen == 64 and shared >= 4  # 8 batches, the first of each worker whole


def test_a_list_of_consecutive_views_moves_as_one_run_split_there() -> None:
    """A list that is what split_with_sizes makes (1-D token arrays; 2-D rows of one
    trailing shape, at an offset into the buffer): one new buffer each, the same values,
    dtypes, shapes and strides; strings, numbers, None and PackedBytes stay the objects."""
    base = torch.arange(4096, dtype=torch.float32)
    packed = PackedBytes([b"ab", b"c"], [0, 2, 3])
    batch = {
        "tokens": list(base[:1000].split_with_sizes([300, 1, 0, 699])),
        "rows": (list(base[1024:].view(-1, 64).split_with_sizes([10, 38])),),
        "meta": {"k": ["x", "y"], "n": 3, "none": None, "bytes": packed},
    }
    moved = to_device(batch, "cpu", copy=True)
    _same(moved, batch)
    assert len(_storages(moved["tokens"])) == 1 == len(_storages(moved["rows"][0]))
    assert moved["tokens"][0].untyped_storage().nbytes() == 4000  # the run, not the buffer
    assert _storages(_tensors(moved)).isdisjoint(_storages(_tensors(batch)))


def test_lists_that_are_not_one_run_move_tensor_by_tensor() -> None:
    """A gap, another order, another dtype, a strided view, a tensor that needs grad,
    tensors made one by one, a list with other values: the same values as .to gives,
    each tensor its own copy (a run's copy would take the gap's bytes along or mix them)."""
    base = torch.arange(1000, dtype=torch.float32)
    grad = torch.arange(6.0).requires_grad_()
    lists = {
        "gap": [base[:10], base[11:20]],
        "order": [base[10:20], base[:10]],
        "dtype": [base[:10], base[10:20].view(torch.int32)],
        "strided": [base[:10], base[10:30:2]],
        "grad": [grad[:3], grad[3:]],
        "apart": [torch.ones(3), torch.zeros(4)],
        "mixed": [base[:10], "x", base[10:20]],
    }
    moved = to_device(lists, "cpu", copy=True)
    each = {
        k: [x.to("cpu", copy=True) if isinstance(x, torch.Tensor) else x for x in v]
        for k, v in lists.items()
    }
    _same(moved, each)
    for name, got in moved.items():
        ts = _tensors(got)
        assert len(_storages(ts)) == len(ts), name
        assert [t.untyped_storage().nbytes() for t in ts] == [t.nbytes for t in ts], name
    assert moved["grad"][0].requires_grad


def test_without_copy_tensors_already_there_are_the_same_objects() -> None:
    """Like Tensor.to: a tensor, or a run of views, already on the device is handed back as
    it is (the list rebuilt, its tensors the same objects)."""
    base = torch.arange(100, dtype=torch.float32)
    batch = {"a": base[:50], "run": [base[:50], base[50:]]}
    moved = to_device(batch, "cpu")
    assert moved["a"] is batch["a"]
    assert all(g is w for g, w in zip(moved["run"], batch["run"], strict=True))
