"""Hostile loads with allow= (issue 31): a rename that names no source of the state, one
onto a name this pipeline does not have, or two names onto one, would start a kept source
over (its samples given twice) or fold two cursors into one: each is refused by name, as
are an allow= of the wrong type and a hand-edited 'retired'."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, StateDictError, WebLoader, mix
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest

MakeShards = Callable[..., Manifest]


def mixed(parts: dict[str, Manifest]) -> ShardDataset:
    names = list(parts)
    sets = [ShardDataset(parts[n], seed=1).shuffle(8).decode() for n in names]
    return mix(sets, weights=[1] * len(names), names=names, stop="longest").batched(3)


@pytest.fixture
def saved(make_shards: MakeShards) -> tuple[dict[str, Manifest], dict[str, Any]]:
    """Two sources a (30 samples) and b (20), and a state after 4 batches (6 of each)."""
    a, b = make_shards([15, 15], prefix="a"), make_shards([10, 10], prefix="b")
    ld = WebLoader(mixed({"a": a, "b": b}))
    it = iter(ld)
    for _ in range(4):
        next(it)
    return {"a": a, "b": b}, json.loads(json.dumps(ld.state_dict()))


def a_keys(batches: list[Any]) -> list[str]:
    return [
        f"{Path(u).name}/{k}"
        for x in batches
        for u, k in zip(x["__url__"], x["__key__"], strict=True)
        if Path(u).name.startswith("a-")
    ]


@pytest.mark.parametrize(
    ("names", "rename", "match"),
    [
        # a typo on the left: 'a' was retired and 'web' (a's shards) started over
        (["web", "b"], {"zz": "web"}, r"'zz'.*not a source of the state.*\['a', 'b'\]"),
        # a typo on the right: the same
        (["web", "b"], {"a": "wbe"}, r"'wbe'.*not a source of this pipeline.*\['web', 'b'\]"),
    ],
)
def test_a_rename_naming_no_source_is_refused(
    saved: tuple[dict[str, Manifest], dict[str, Any]],
    names: list[str],
    rename: dict[str, Any],
    match: str,
) -> None:
    parts, state = saved
    ld = WebLoader(mixed({n: parts["a" if n != "b" else "b"] for n in names}))
    try:
        ld.load_state_dict(state, allow={"sources": rename})
    except StateDictError as exc:
        assert re.search(match, str(exc)), str(exc)
        return
    tail = list(ld)
    # what went wrong when it was taken: a's 6 samples given before are given again
    assert len(a_keys(tail)) == 24, f"loaded, and a's samples given again: {len(a_keys(tail))}"
    pytest.fail("the rename was taken")


@pytest.mark.parametrize(
    ("names", "rename"),
    [(["b"], {"a": "b"}), (["x"], {"a": "x", "b": "x"})],
)
def test_two_sources_onto_one_name_are_refused(
    saved: tuple[dict[str, Manifest], dict[str, Any]], names: list[str], rename: dict[str, str]
) -> None:
    """Two cursors onto one name: one was kept with no error when their shards agree."""
    parts, state = saved
    ld = WebLoader(mixed(dict.fromkeys(names, parts["b"])))
    with pytest.raises(StateDictError, match=r"two sources .*onto"):
        ld.load_state_dict(state, allow={"sources": rename, "weights": True})


def test_a_rename_without_a_mixture_is_refused(make_shards: MakeShards) -> None:
    m = make_shards([6, 6])
    ld = WebLoader(ShardDataset(m, seed=1).batched(2))
    next(iter(ld))
    state = ld.state_dict()
    with pytest.raises(StateDictError, match=r"'x'.*no mixture"):
        WebLoader(ShardDataset(m, seed=1).batched(2)).load_state_dict(
            state, allow={"sources": {"x": "y"}}
        )


@pytest.mark.parametrize("rename", [{"a": 1}, {1: "a"}, {"a": None}])
def test_a_rename_of_other_than_names_is_a_config_error(
    saved: tuple[dict[str, Manifest], dict[str, Any]], rename: dict[Any, Any]
) -> None:
    """{'a': 1} was taken as a rename to '1': a retired, and started over as a new source."""
    parts, state = saved
    with pytest.raises(ConfigError, match=r"allow.*sources.*names"):
        WebLoader(mixed(parts)).load_state_dict(state, allow={"sources": rename})


@pytest.mark.parametrize("allow", [5, 2.0, object()])
def test_an_allow_that_is_no_collection_is_a_config_error(
    saved: tuple[dict[str, Manifest], dict[str, Any]], allow: Any
) -> None:
    """allow=5 was a bare TypeError ('int' object is not iterable)."""
    parts, state = saved
    with pytest.raises(ConfigError, match="allow"):
        WebLoader(mixed(parts)).load_state_dict(state, allow=allow)


@pytest.mark.parametrize("retired", [{"z": "bad"}, ["z"], {"z": {"samples": "3"}}])
def test_a_hand_edited_retired_is_a_state_dict_error(
    saved: tuple[dict[str, Manifest], dict[str, Any]], retired: Any
) -> None:
    """{'z': 'bad'} was a bare ValueError from inside the load."""
    parts, state = saved
    state["retired"] = retired
    with pytest.raises(StateDictError, match="retired"):
        WebLoader(mixed(parts)).load_state_dict(state)
