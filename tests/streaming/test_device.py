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


def test_views_of_every_layout_keep_dtype_shape_strides_and_offset() -> None:
    """Views of one buffer at offsets, transposed, strided, of another dtype (a bf16 and an
    int32 view of the same bytes), a tuple and a nested dict: all equal after the move,
    one buffer in all; other values (strings, numbers, None, PackedBytes) are the same objects."""
    base = torch.arange(4096, dtype=torch.float32)
    grid = base[1024:].view(48, 64)
    packed = PackedBytes([b"ab", b"c"], [0, 2, 3])
    batch = {
        "a": base[:100],
        "t": grid.t(),
        "s": grid[::3, 5:9],
        "halves": base[2000:2100].view(torch.bfloat16),
        "ints": (base[100:1024].view(torch.int32), base[3000:]),
        "meta": {"k": ["x", "y"], "n": 3, "none": None, "bytes": packed},
    }
    moved = to_device(batch, "cpu", copy=True)
    _same(moved, batch)
    got = _tensors(moved)
    assert len(_storages(got)) == 1
    assert got[0].untyped_storage().nbytes() == base.untyped_storage().nbytes()
    assert _storages(got).isdisjoint(_storages(_tensors(batch)))


def test_a_small_view_of_a_big_buffer_moves_alone() -> None:
    """Two views covering under half of a 4 MB buffer: each copied on its own (the copy is
    as big as the view), not the buffer whole; a tensor on its own buffer likewise."""
    big = torch.zeros(1 << 20, dtype=torch.float32)
    batch = [big[:10], big[500:700], torch.ones(5)]
    moved = to_device(batch, "cpu", copy=True)
    _same(moved, batch)
    assert [t.untyped_storage().nbytes() for t in moved] == [40, 800, 20]


def test_without_copy_tensors_already_there_are_the_same_objects() -> None:
    """Like Tensor.to: a tensor already on the device is handed back as it is; a tensor that
    needs grad or a Parameter moves as .to moves it (set_ cannot remake those)."""
    base = torch.arange(100, dtype=torch.float32)
    batch = {"a": base[:50], "b": base[50:]}
    moved = to_device(batch, "cpu")
    assert moved["a"] is batch["a"] and moved["b"] is batch["b"]
    p = torch.nn.Parameter(torch.ones(3))
    grad = torch.arange(6.0).requires_grad_()
    got = to_device([p, grad[:3], grad[3:]], "cpu", copy=True)
    assert got[1].requires_grad and torch.equal(got[2], torch.tensor([3.0, 4.0, 5.0]))
    assert (
        torch.equal(got[0], p)
        and got[0].untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
    )
