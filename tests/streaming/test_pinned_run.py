"""0 workers and thread workers with pin_memory: a list of same-dtype arrays or tensors (a
batch's token arrays) becomes views of one pinned buffer, equal to what pinning each gives.
Pinning needs an accelerator, so the join is checked here unpinned (``pin=False``);
scripts/bench/gpu.py runs it pinned on a CUDA machine."""

from __future__ import annotations

import numpy as np
import torch

from shardkit.streaming.transfer import _pinned_run, deliver


def test_a_list_of_arrays_becomes_views_of_one_buffer_equal_to_each() -> None:
    rng = np.random.default_rng(3)
    lists = [
        [rng.integers(0, 1000, size=n, dtype=np.int32) for n in (300, 0, 1, 1800)],
        [rng.random((n, 3, 2)).astype(np.float16) for n in (2, 1, 0, 5)],
        [np.arange(10, dtype=np.int64)[::-2], np.arange(4, dtype=np.int64)],  # strided
    ]
    ro = np.arange(6, dtype=np.uint8)
    ro.flags.writeable = False
    lists.append([ro, ro[:2]])
    for x in lists:
        got = _pinned_run(x, pin=False)
        want = deliver(x)  # each array as every mode hands it out unpinned
        assert got is not None and len(got) == len(want)
        assert len({t.untyped_storage().data_ptr() for t in got}) == 1
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            assert torch.equal(g, w)


def test_a_list_of_tensors_joins_too_as_thread_workers_deliver_it() -> None:
    """Thread workers pin batches already delivered (tensors): joined the same way."""
    base = torch.arange(20, dtype=torch.float32)
    x = [base[:5], base[5:5], base[10:].reshape(5, 2)[:, 0].contiguous(), torch.ones(3)]
    got = _pinned_run(x, pin=False)
    assert got is not None and len({t.untyped_storage().data_ptr() for t in got}) == 1
    for g, w in zip(got, x, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_other_lists_are_walked_item_by_item() -> None:
    a = np.arange(5, dtype=np.int32)
    for x in (
        [a],  # one array: nothing to join
        [a, a.astype(np.int64)],  # dtypes differ
        [a.reshape(5, 1), a],  # ranks differ
        [a.reshape(5, 1), np.zeros((2, 2), np.int32)],  # trailing shapes differ
        [a, "x"],
        [np.float32(1.0), np.float32(2.0)],  # numpy scalars are not arrays
        [np.array(1), np.array(2)],  # 0-d
        [a.astype(">i4"), a.astype(">i4")],  # big-endian stays numpy
        [torch.arange(3), a],  # a tensor and an array
        [torch.ones(3), torch.ones(3, requires_grad=True)],
        [torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.complex64).conj()],
        [torch.ones(3), torch.ones(3)._neg_view()],
    ):
        assert _pinned_run(x, pin=False) is None
