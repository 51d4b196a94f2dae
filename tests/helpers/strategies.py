"""Hypothesis strategies shared by the tests (one home, as STYLE asks): plan inputs, tar
member names and samples, manifests."""

from __future__ import annotations

import string
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from shardkit.format.manifest.model import Manifest, ShardEntry
from shardkit.format.pieces import Pieces, piece_count

__all__ = [
    "counts_st",
    "epoch_st",
    "generation_st",
    "keys",
    "manifests",
    "member_names",
    "ref_counts_st",
    "sample_lists",
    "seed_st",
    "workers_st",
    "world_st",
]

# -- plans ---------------------------------------------------------------------------
counts_st = st.lists(st.integers(0, 40), min_size=1, max_size=12)
world_st = st.integers(1, 8)
workers_st = st.integers(0, 4)  # 0: the main process reads, as one worker
seed_st = st.integers(0, 2**32 - 1)
epoch_st = st.integers(0, 1000)
ref_counts_st = st.lists(st.integers(0, 30), min_size=0, max_size=14)
generation_st = st.tuples(
    st.integers(1, 7), st.integers(1, 4), st.sampled_from([0, 0, 1, 2, 5, 16])
)


# -- tar members and samples --------------------------------------------------------
member_names = st.text(
    alphabet=string.ascii_letters + string.digits + "/._-", min_size=1, max_size=100
)
# any character a file name can hold, but the few the key rules refuse
_CHARS = st.characters(codec="utf-8", exclude_characters="/\\\0")
_DIR_PART = st.text(_CHARS, min_size=1, max_size=12).filter(lambda p: p not in (".", ".."))
_LAST_PART = st.text(st.characters(codec="utf-8", exclude_characters="/\\\0."), min_size=1)
_LONG_PART = st.text(st.sampled_from("abcdefghij_-éü字"), min_size=60, max_size=120)


@st.composite
def keys(draw: st.DrawFn) -> str:
    dirs = draw(st.lists(st.one_of(_DIR_PART, _LONG_PART), max_size=3))
    last = draw(st.one_of(_LAST_PART.map(lambda s: s[:20]), _LONG_PART))
    key = "/".join([*dirs, last])
    # "C:..." looks like a Windows drive; readers refuse it as absolute
    if len(key) >= 2 and key[1] == ":" and key[0].isascii() and key[0].isalpha():
        key = "k" + key
    return key


_FIELD = st.sampled_from(["txt", "json", "bin", "cls", "tokens.npy", "a.b.c", "x"])
_FIELDS = st.dictionaries(_FIELD, st.binary(max_size=3000), min_size=1, max_size=4)


@st.composite
def sample_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    ks = draw(st.lists(keys(), min_size=1, max_size=25, unique=True))
    return [{"__key__": k, **draw(_FIELDS)} for k in ks]


# -- manifests ------------------------------------------------------------------------
hexes = st.binary(min_size=32, max_size=32).map(bytes.hex)
piece_hexes = st.binary(min_size=16, max_size=16).map(bytes.hex)
names = st.text("abcxyz_-0123456789", min_size=1, max_size=8)


@st.composite
def _pieces(draw: st.DrawFn, size: int, mode: str) -> Pieces | None:
    """None, or piece digests of pieces of one size (``all``), of one size or none
    (``some``), of a size per shard (``sizes``): at most 8 pieces a shard."""
    if mode == "none" or (mode == "some" and draw(st.booleans())):
        return None
    piece = 2**38 if mode != "sizes" else draw(st.sampled_from([2**37, 2**39, 2**41]))
    n = piece_count(size, piece)
    return Pieces(piece, tuple(draw(st.lists(piece_hexes, min_size=n, max_size=n))))


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    n = draw(st.integers(0, 12))
    patterned = draw(st.booleans())
    start = draw(st.integers(0, 5))
    urls = (
        [f"part/data-{start + i:06d}.tar" for i in range(n)]
        if patterned
        else draw(
            st.lists(names, min_size=n, max_size=n, unique=True).map(
                lambda v: [f"{x}.tar" for x in v]
            )
        )
    )
    with_index = draw(st.sampled_from(["none", "all", "some"]))
    with_pieces = draw(st.sampled_from(["none", "all", "some", "sizes"]))
    entries = []
    for i, url in enumerate(urls):
        indexed = with_index == "all" or (with_index == "some" and draw(st.booleans()))
        entries.append(
            ShardEntry(
                url,
                draw(st.integers(0, 2**40)),
                draw(st.integers(0, 10**6)),
                "sha256:" + draw(hexes),
                url + ".idx" if indexed else None,
                ("sha256:" + draw(hexes)) if indexed and draw(st.booleans()) else None,
            )
        )
        entries[-1] = replace(entries[-1], pieces=draw(_pieces(entries[-1].size, with_pieces)))
        del i
    return Manifest(shards=entries, fields={"json": {"count": 1, "bytes": 2}})
