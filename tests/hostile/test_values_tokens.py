"""Hostile values at pack_tokens: ids past a narrow dtype, mixed dtypes in one stream (a
narrow one first), eos/pad outside the dtype. Ids are never narrowed: the output widens to
the widest dtype seen, or an explicit ``dtype=`` refuses an id it cannot hold by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardkit as sk
from shardkit.errors import ConfigError, DecodeError
from shardkit.stages import Context, Cursor, Stage
from shardkit.stages.tokens import PackTokens

SEQ = 16


def write_docs(out: Path, docs: list[np.ndarray], prefix: str) -> str:
    with sk.ShardWriter(out, maxcount=8, prefix=prefix) as w:
        for i, doc in enumerate(docs):
            w.write({"__key__": f"{prefix}-{i:04d}", "tokens.npy": doc})
    return str(out / "manifest.json")


def docs_of(dtype: Any, base: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(base + rng.integers(0, 1000, int(k))).astype(dtype) for k in rng.integers(1, 40, n)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, list[np.ndarray]]]:
    root = tmp_path_factory.mktemp("tokens")
    web = docs_of(np.uint16, 0, 20, 1)  # ids < 1000
    code = docs_of(np.int32, 70_000, 20, 2)  # ids >= 65,536
    return {
        "web": (write_docs(root / "web", web, "web"), web),
        "code": (write_docs(root / "code", code, "code"), code),
    }


def mixed(corpora: dict[str, Any], **kw: Any) -> sk.ShardDataset:
    sets = {
        n: sk.ShardDataset(m, seed=1, shardshuffle=False).decode() for n, (m, _) in corpora.items()
    }
    # "web" (uint16) is drawn first often: the first document is narrow
    return sk.mix(sets, [3, 1], stop="longest", seed=0).pack_tokens("tokens.npy", SEQ, **kw)


def all_tokens(corpora: dict[str, Any]) -> list[int]:
    return sorted(int(t) for _, docs in corpora.values() for d in docs for t in d)


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_a_narrow_source_first_never_narrows_a_wide_ones_ids(
    corpora: dict[str, Any], strategy: str
) -> None:
    seqs = [np.asarray(s) for s in mixed(corpora, strategy=strategy, pad=-1)]
    sizes = [s.dtype.itemsize for s in seqs]
    assert seqs and sizes == sorted(sizes)  # widened as wider ids came, never narrowed back
    got = sorted(int(t) for s in seqs for t in s if t != -1)
    want = all_tokens(corpora)
    if strategy == "greedy":  # the tail shorter than a sequence is dropped
        assert set(got) <= set(want) and len(want) - len(got) < SEQ
    else:
        assert got == want
    assert max(got) >= 70_000


def test_an_explicit_dtype_refuses_an_id_it_cannot_hold_by_name(corpora: dict[str, Any]) -> None:
    with pytest.raises(DecodeError, match=r"token id 7\d{4} of sample 'code-\d{4}'.*uint16"):
        list(mixed(corpora, dtype=np.uint16))
    seqs = list(mixed(corpora, dtype="int64"))
    assert all(s.dtype == np.int64 for s in seqs)


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"dtype": np.uint16, "pad": -100, "strategy": "best_fit"}, "pad=-100"),
        ({"dtype": np.uint16, "eos": 70_000}, "eos=70000"),
        ({"dtype": np.int8, "eos": 128}, "eos=128"),
        ({"eos": 1.5}, "eos must be an int"),
        ({"pad": True}, "pad must be an int"),
        ({"dtype": np.float32}, "integer dtype"),
        ({"dtype": "nonsense"}, "not a numpy dtype"),
    ],
)
def test_eos_pad_or_dtype_outside_what_it_can_hold_is_a_config_error(
    corpora: dict[str, Any], kw: dict[str, Any], what: str
) -> None:
    with pytest.raises(ConfigError, match=what):
        mixed(corpora, **kw)


@pytest.mark.parametrize("seq_len", [2.5, True, 0, -3, "16", None])
def test_seq_len_must_be_a_positive_integer(corpora: dict[str, Any], seq_len: Any) -> None:
    ds = sk.ShardDataset(corpora["web"][0]).decode()
    with pytest.raises(ConfigError, match="seq_len"):
        ds.pack_tokens("tokens.npy", seq_len)


class ListStage(Stage):
    """A source of the given samples, in order (its state: how many were given)."""

    name = "list"

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        super().__init__(None)
        self.samples = samples

    def iterate(self, ctx: Context, state: Any = None) -> Cursor:
        cursor = _ListCursor()
        cursor.items = cursor.run(self.samples[(state or {}).get("n", 0) :])
        return cursor


class _ListCursor(Cursor):
    n = 0

    def run(self, samples: list[dict[str, Any]]) -> Any:
        for s in samples:
            self.n += 1
            yield s

    def state(self) -> dict[str, Any]:
        return {"stage": "list", "n": self.n}


dtypes = st.sampled_from(["uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", ">i4"])


@settings(max_examples=25, deadline=None)
@given(
    specs=st.lists(
        st.tuples(dtypes, st.integers(1, 9), st.integers(0, 2**31)), min_size=1, max_size=6
    ),
    strategy=st.sampled_from(["greedy", "best_fit"]),
    eos=st.sampled_from([None, 0, 255, 70_000, -5]),
)
def test_every_id_comes_out_as_it_went_in(
    specs: list[tuple[str, int, int]], strategy: str, eos: int | None
) -> None:
    docs = []
    for dtype, n, seed in specs:
        info = np.iinfo(np.dtype(dtype))
        rng = np.random.default_rng(seed)
        docs.append(rng.integers(info.min, int(info.max) + 1, n, dtype=np.int64).astype(dtype))
    samples = [{"__key__": f"d{i}", "t": d} for i, d in enumerate(docs)]
    stage = PackTokens(ListStage(samples), "t", 4, eos=eos, strategy=strategy, pad=0)
    out = list(stage.iterate(Context()))
    want = [int(t) for d in docs for t in [*d.tolist(), *([] if eos is None else [eos])]]
    if strategy == "greedy":
        got = [int(t) for s in out for t in s]
        assert got == want[: len(got)] and len(want) - len(got) < 4
    else:  # placed best-fit: every document's ids, padding aside, as a multiset
        got = [int(t) for s in out for t in s]
        for t in want:
            got.remove(t)
        assert set(got) <= {0}
