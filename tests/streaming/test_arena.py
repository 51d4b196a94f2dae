"""The worker arenas: batches cross from worker processes in reused shared-memory slots,
and a slot is never written while a batch handed out still reads it."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardkit import ShardDataset, WebLoader
from shardkit.errors import TransferError
from shardkit.format.manifest.model import Manifest
from shardkit.streaming import arena
from shardkit.streaming.arena import SLOTS, Lanes, Parcel, WorkerArena, open_parcel, take_over
from shardkit.streaming.transfer import InlineBatch, PackedBytes, deliver
from shardkit.write.writer import ShardWriter

MakeShards = Callable[..., Manifest]


def _batch(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "__key__": [f"k{i}-{j}" for j in range(4)],
        "tokens": rng.integers(0, 1 << 30, size=(4, 700), dtype=np.int32),
        "small": np.arange(3, dtype=np.int64) + i,
        "bin": [rng.bytes(70_000) for _ in range(4)],
        "t": torch.full((8, 64), float(i), dtype=torch.bfloat16),
        "meta": {"cls": i, "text": "x"},
    }


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["__key__"] == want["__key__"] and got["meta"] == want["meta"]
    assert torch.equal(got["tokens"], torch.from_numpy(want["tokens"]))
    assert torch.equal(got["small"], torch.from_numpy(want["small"]))
    assert isinstance(got["bin"], PackedBytes) and list(got["bin"]) == want["bin"]
    assert got["t"].dtype == torch.bfloat16 and torch.equal(got["t"], want["t"])


def _pack(a: WorkerArena, i: int) -> Parcel:
    p = a.pack(_batch(i))
    assert isinstance(p, Parcel)
    return p


def test_a_held_batch_is_never_overwritten_and_released_slots_are_reused() -> None:
    """Batches kept alive past every slot: each keeps its bytes (a slot is reused only
    once released); batches let go of free their slots, which the next batches reuse."""
    lanes = Lanes(1)
    a = WorkerArena(lanes, 0)
    held = [(i, open_parcel(_pack(a, i))) for i in range(SLOTS + 5)]
    for i, got in held:
        _same(got, _batch(i))
    gens = {s.gen for s in a.slots if s is not None}
    del held
    gc.collect()
    slots = set()
    for i in range(40):  # each batch dropped before the next: the same slot again
        p = _pack(a, 100 + i)
        slots.add((p.slot, p.gen))
        _same(open_parcel(p), _batch(100 + i))
    assert len(slots) == 1
    assert {s.gen for s in a.slots if s is not None} == gens, "no segment made again"


def test_a_pinned_copy_releases_the_slot_at_once_and_keeps_its_bytes() -> None:
    lanes = Lanes(1)
    a = WorkerArena(lanes, 0)
    first = _pack(a, 1)
    copy = first.pin_memory()
    second = _pack(a, 2)
    assert (second.slot, second.gen) == (first.slot, first.gen), "the slot was reused"
    assert second.segment is None, "the training process has the segment already"
    _same(copy, _batch(1))
    _same(open_parcel(second), _batch(2))


def test_a_release_from_another_generation_or_batch_frees_nothing() -> None:
    lanes = Lanes(1)
    a = WorkerArena(lanes, 0)
    p = _pack(a, 1)
    got = open_parcel(p)
    ctl = lanes.ctl[0, p.slot].numpy()
    ctl[0] = arena._word(p.gen + 1, p.seq)  # an earlier worker process's release
    assert _pack(a, 2).slot != p.slot
    ctl[0] = arena._word(p.gen, p.seq - 1)  # the slot's previous batch
    assert _pack(a, 3).slot != p.slot
    _same(got, _batch(1))


def test_a_parcel_that_does_not_match_its_slot_is_an_error_not_data() -> None:
    lanes = Lanes(1)
    a = WorkerArena(lanes, 0)
    p = _pack(a, 1)
    view = p.segment.numpy() if p.segment is not None else None
    assert view is not None
    view[:8] = np.frombuffer((p.seq + 1).to_bytes(8, "little"), dtype=np.uint8)
    with pytest.raises(TransferError, match=r"worker 0's batch 1 \(slot \d+\): .*another batch"):
        open_parcel(p)
    q = _pack(WorkerArena(lanes, 0), 2)  # a fresh worker process for the same worker
    q.segment = None  # its segment lost on the way
    with pytest.raises(TransferError, match="segment never arrived"):
        open_parcel(q)


def test_a_loader_gone_lets_go_of_its_segments() -> None:
    lanes = Lanes(1)
    token = lanes.token
    open_parcel(_pack(WorkerArena(lanes, 0), 1))
    assert any(k[0] == token for k in arena._SEGMENTS)
    del lanes
    gc.collect()
    assert not any(k[0] == token for k in arena._SEGMENTS)


@pytest.mark.integration
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_worker_batches_kept_by_the_training_loop_stay_whole(tmp_path: Path, ctx: str) -> None:
    """Every batch of two epochs kept in a list (more than a worker's slots): each equals
    the same batch made by thread workers (the same order, nothing crossing a process);
    arrays, tensors from the DataLoader's collate and big byte fields alike."""
    rng = np.random.default_rng(0)
    with ShardWriter(tmp_path, maxsize="2MB") as w:
        for i in range(160):
            w.write(
                {
                    "__key__": f"k{i:04d}",
                    "tokens.npy": rng.integers(0, 1 << 20, size=300, dtype=np.int32),
                    "bin": rng.bytes(40_000 + i),
                }
            )
    m = Manifest.load(tmp_path / "manifest.json")

    def run(mode: str, batch_size: int | None) -> list[Any]:
        ds = ShardDataset(m, seed=2).shuffle(9).decode().to_tuple("__key__", "tokens.npy", "bin")
        ds = ds if batch_size else ds.batched(8)
        loader = WebLoader(
            ds, batch_size, num_workers=2, worker_mode=mode, multiprocessing_context=ctx
        )
        out = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            out += list(loader)
        return out

    # spawn's own risk is what crosses to a started worker (the data set, the control
    # block, segments), whatever collates: one batching there (two cost 2 worker starts)
    for batch_size in (None, 8) if ctx == "fork" else (None,):
        want = run("thread", batch_size)  # the same order, nothing crosses a process
        got = run("process", batch_size)
        assert len(got) == len(want) == 40 > 2 * SLOTS
        for g, w_ in zip(got, want, strict=True):
            assert list(g[0]) == list(w_[0])
            assert torch.equal(torch.as_tensor(g[1]), torch.as_tensor(w_[1]))
            assert [bytes(b) for b in g[2]] == [bytes(b) for b in w_[2]]
        assert isinstance(got[0][1], torch.Tensor)
        if batch_size is None:  # torch's default_collate leaves a tuple of bytes
            assert isinstance(got[0][2], PackedBytes)


def test_arrays_and_tensors_of_every_layout_cross_whole() -> None:
    """Strided, offset, Fortran-order, bool, complex and half values come back equal;
    what a slot cannot hold (big-endian arrays, tensors that need grad) crosses as it is."""
    base = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    arr = np.arange(4096, dtype=np.int16).reshape(64, 64)
    tree = {
        "t_transposed": base.t(),
        "t_offset": base[3:40, 5:60],
        "t_bool": base > 2000,
        "t_complex": torch.complex(base, -base),
        "t_half": base.half(),
        "a_fortran": np.asfortranarray(arr),
        "a_bool": arr % 3 == 0,
        "a_bigendian": arr.astype(">i4"),
        "t_grad": torch.ones(512, requires_grad=True),
    }
    a = WorkerArena(Lanes(1), 0)
    got = open_parcel(_pack_tree(a, tree))
    for k, v in tree.items():
        g = got[k]
        if k in ("a_bigendian", "t_grad"):
            assert g is v
        elif isinstance(v, np.ndarray):
            assert isinstance(g, torch.Tensor) and np.array_equal(g.numpy(), v)
        else:
            assert g.dtype == v.dtype and g.shape == v.shape and torch.equal(g, v)


def _pack_tree(a: WorkerArena, tree: Any) -> Parcel:
    p = a.pack(tree)
    assert isinstance(p, Parcel)
    return p


def test_numbers_in_another_byte_order_stay_numpy_in_every_mode() -> None:
    """torch cannot hold a big-endian array: it stays numpy (it raised before)."""
    big = np.arange(10, dtype=">i4")
    assert deliver({"x": big})["x"] is big and deliver((big,), pin=True)[0] is big


def test_a_workers_small_first_batch_crosses_the_pipe_as_a_slot_would_give_it() -> None:
    """The first batch of a worker (under INLINE_FIRST, no tensors) is pickled whole, no
    segment made; it arrives with the types, layouts and values a slot gives the next."""
    import pickle

    def batch(i: int) -> dict[str, Any]:
        b = _batch(i)
        del b["t"]  # a CPU tensor goes through the slot, first batch or not
        b["fortran"] = np.asfortranarray(np.arange(600, dtype=np.float64).reshape(20, 30) + i)
        return b

    a = WorkerArena(Lanes(1), 0)
    first = a.pack(batch(1))
    assert isinstance(first, InlineBatch) and all(s is None for s in a.slots)
    got = take_over(pickle.loads(pickle.dumps(first)))[0]  # as the worker's pipe carries it
    pinned = pickle.loads(pickle.dumps(first)).pin_memory()  # the pin thread's way (no CUDA:
    assert take_over(pinned)[0].keys() == got.keys()  # a plain copy), then taken over
    second = a.pack(batch(2))
    assert isinstance(second, Parcel)  # the next batches take slots
    then = open_parcel(second)
    for out, want in ((got, batch(1)), (take_over(pinned)[0], batch(1)), (then, batch(2))):
        assert out["__key__"] == want["__key__"] and out["meta"] == want["meta"]
        assert torch.equal(out["tokens"], torch.from_numpy(want["tokens"]))
        assert isinstance(out["bin"], PackedBytes) and list(out["bin"]) == want["bin"]
        assert out["fortran"].is_contiguous()
        assert torch.equal(out["fortran"], torch.from_numpy(np.ascontiguousarray(want["fortran"])))
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in then.items()}
    big = WorkerArena(Lanes(1), 0)  # over INLINE_FIRST: the first batch takes a slot too
    huge = {"x": np.zeros(arena.INLINE_FIRST // 8 + 1, dtype=np.int64)}
    assert isinstance(big.pack(huge), Parcel)
    with_tensor = WorkerArena(Lanes(1), 0)
    assert isinstance(with_tensor.pack(_batch(3)), Parcel)


def test_control_blocks_start_as_zeros_in_shared_memory() -> None:
    """The workers' control block and the mailbox are made in shared memory without a fill
    (a fresh shared segment is zeros): every slot starts unreleased and unknown."""
    from shardkit.streaming.shared import Mailbox

    for _ in range(3):  # memory the allocator handed out before, dirtied
        torch.full((1 << 16,), 7, dtype=torch.int64).sum()
        lanes, box = Lanes(3), Mailbox()
        assert lanes.ctl.is_shared() and box.buf.is_shared()
        assert lanes.ctl.shape == (3, SLOTS, 2) and lanes.ctl.dtype == torch.int64
        assert not lanes.ctl.any() and not box.buf.any()
    box.write({"epoch": 3})
    assert box.read() == {"epoch": 3}


def _layout(x: Any) -> Any:
    if type(x) is list:
        return [_layout(v) for v in x]
    strides = x.stride() if type(x) is torch.Tensor else x.strides
    return type(x), x.dtype, tuple(x.shape), strides


def _crossed(a: WorkerArena, tree: Any, pin: bool) -> tuple[type, Any]:
    """``tree`` as a worker process sends it (pickled) and the training process opens it
    (the DataLoader's pin thread, pinning where it can, or the loader)."""
    opened = pickle.loads(pickle.dumps(a.crossing(tree))).load()
    return type(opened), opened.pin_memory() if pin else take_over(opened)[0]


@pytest.mark.parametrize("pin", [False, True])
def test_empty_arrays_and_runs_of_rows_cross_as_every_mode_gives_them(pin: bool) -> None:
    """A worker process hands out what threads and 0 workers do (types, dtypes, shapes,
    strides, values) for empty arrays, which numpy leaves with strides of 0 (astype, copies)
    where pickle rebuilds C order's, and for a list of arrays of rows split from its slot."""
    rng = np.random.default_rng(5)
    empty = rng.standard_normal((0, 3)).astype(np.float32)  # strides (0, 0)
    frozen = empty.copy()
    frozen.flags.writeable = False
    rows = [rng.standard_normal((n, 3)).astype(np.float32) for n in (90, 0, 41, 130)]
    tree = {
        "empty": empty,
        "frozen": frozen,
        "big_endian": empty.astype(">f4"),
        "objects": np.zeros((0, 2), object).astype(object),
        "one_d": np.zeros(0, np.int64).astype(np.int64),
        "rows": rows,
        "pad": np.zeros(600, np.int32),
    }
    a = WorkerArena(Lanes(1), 0)
    for kind in (InlineBatch, Parcel):  # the first batch crosses the pipe whole, then slots
        crossed, got = _crossed(a, tree, pin)
        assert crossed is kind
        want = deliver(tree)
        for k in tree:
            assert _layout(got[k]) == _layout(want[k]), k
        for g, w in zip(got["rows"], want["rows"], strict=True):
            assert torch.equal(g, w)
