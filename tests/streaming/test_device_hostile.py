"""to_device against lists built to look like one run of a buffer and not be one: the same
values and types as moving each tensor by ``.to(copy=True)``, or the same error."""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch

from shardkit import to_device


def _each(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to("cpu", copy=True) for t in ts]


def _complex(n: int) -> torch.Tensor:
    return torch.arange(float(n)).to(torch.complex64) * (1 + 2j)


def _conj_second() -> list[torch.Tensor]:
    c = _complex(8)
    return [c[:4], c[4:].conj()]


def _neg_view_second() -> list[torch.Tensor]:
    a = torch.arange(10.0)
    return [a[:4], torch._neg_view(a[4:])]


@pytest.mark.parametrize("make", [_conj_second, _neg_view_second])
def test_a_conjugate_or_negative_view_in_a_run_keeps_its_sign(
    make: Callable[[], list[torch.Tensor]],
) -> None:
    """A view whose conjugate or negative bit is set reads its buffer's bytes negated: the
    run's raw copy of those bytes lost the bit of every tensor but the first (4+4j where
    4-4j was, 4 where -4 was)."""
    ts = make()
    got = to_device(ts, "cpu", copy=True)
    for g, w in zip(got, _each(ts), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.resolve_conj().resolve_neg(), w.resolve_conj().resolve_neg())


def _sparse() -> list[torch.Tensor]:
    return [torch.eye(3).to_sparse(), torch.eye(2).to_sparse()]


def _quantized() -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized dtypes are deprecated: torch says so
        q = torch.quantize_per_tensor(torch.arange(8.0), 0.5, 0, torch.qint8)
    return [q[:4], q[4:]]


def _nested() -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype: torch says so
        nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(2.0)])
    return [nt, nt]


def _strided_then_sparse() -> list[torch.Tensor]:
    return [torch.arange(3.0), torch.eye(3).to_sparse()]


def _strided_then_nested() -> list[torch.Tensor]:
    return [torch.arange(3.0), _nested()[0]]


@pytest.mark.parametrize(
    "make", [_sparse, _quantized, _nested, _strided_then_sparse, _strided_then_nested]
)
def test_lists_of_other_layouts_move_as_dot_to_moves_them(
    make: Callable[[], list[torch.Tensor]],
) -> None:
    """Sparse, quantized and nested tensors in a list move by .to; the run's checks asked
    for their data pointer or shape and raised (RuntimeError: no storage, an internal
    assert, 'doesn't support sizes')."""
    ts = make()
    got = to_device(ts, "cpu", copy=True)
    for g, w in zip(got, _each(ts), strict=True):
        assert type(g) is type(w) and g.layout == w.layout and g.dtype == w.dtype
        if g.is_nested:
            assert all(torch.equal(a, b) for a, b in zip(g.unbind(), w.unbind(), strict=True))
        else:
            assert torch.equal(_dense(g), _dense(w))


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.dequantize() if t.is_quantized else t.to_dense()


class _Batch(NamedTuple):
    keys: list[str]
    tokens: list[torch.Tensor]
    mask: torch.Tensor


def test_namedtuples_and_dict_subclasses_have_their_tensors_moved() -> None:
    """A collate function's namedtuple (torch's default_collate keeps them; WebLoader hands
    them out as they are in every worker mode), an OrderedDict, a defaultdict: their type
    kept and every tensor in them moved, a run of token views as one copy too. Their
    tensors were left where they were: on the host for a "cuda" move, the batch's own
    memory for copy=True."""
    base = torch.arange(100, dtype=torch.int32)
    mask = torch.ones(3, dtype=torch.bool)
    nested = defaultdict(list, {"m": mask})
    batch = {
        "nt": _Batch(["a", "b", "c"], list(base.split_with_sizes([10, 0, 90])), mask),
        "od": OrderedDict(m=mask, t=(base,)),
        "dd": nested,
    }
    moved = to_device(batch, "cpu", copy=True)
    nt, od, dd = moved["nt"], moved["od"], moved["dd"]
    assert type(nt) is _Batch and type(od) is OrderedDict and type(dd) is defaultdict
    assert dd.default_factory is list and list(od) == ["m", "t"]
    assert nt.keys is batch["nt"].keys
    got = [*nt.tokens, nt.mask, od["m"], od["t"][0], dd["m"]]
    want = [*batch["nt"].tokens, mask, mask, base, mask]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
        assert g.untyped_storage().data_ptr() not in {base.data_ptr(), mask.data_ptr()}
    assert len({t.untyped_storage().data_ptr() for t in nt.tokens}) == 1
