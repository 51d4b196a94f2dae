"""Hostile review of issue 31, second pass: chains of loads (a state saved after an elastic
or batching-change load, loaded again) give each document once."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit import ShardDataset, WebLoader, mix
from shardkit.cli import cli
from shardkit.errors import StateDictError
from shardkit.format.manifest.model import Manifest
from tests.streaming.test_budget import lognormal_shards


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """120 documents of log-normal length (median 300 tokens) in 4 shards. The tests read
    them undecoded (a cost of 'tokens.npy' counts raw bytes): numpy parses an npy header
    with ast.literal_eval, which raised SystemError ('AST constructor recursion depth
    mismatch') now and then under thread workers on CPython 3.11.7."""
    return lognormal_shards(tmp_path_factory.mktemp("docs"), n=120, shards=4)


def pipeline(m: Manifest, batching: str) -> ShardDataset:
    ds = ShardDataset(m, seed=3).shuffle(16)
    if batching == "budget":
        return ds.batched(budget=3000, cost="tokens.npy", buffer=20)
    return ds.batched(int(batching))


def run(m: Manifest, legs: list[tuple[str, int, int | None]]) -> tuple[list[str], WebLoader]:
    """Each leg: a loader of ``batching`` on ``workers`` thread workers, loading the state
    the leg before saved (a batching change allowed), giving ``steps`` batches (None: to
    the epoch's end)."""
    state: dict[str, Any] | None = None
    got: list[str] = []
    for batching, workers, steps in legs:
        ld = WebLoader(pipeline(m, batching), num_workers=workers, worker_mode="thread")
        if state is not None:
            ld.load_state_dict(state, allow={"batch_size"})
        for n, batch in enumerate(ld, 1):
            got += list(batch["__key__"])
            if n == steps:
                break
        state = json.loads(json.dumps(ld.state_dict()))
    return got, ld


def twice(keys: list[str]) -> list[str]:
    return sorted(k for k, v in collections.Counter(keys).items() if v > 1)


@pytest.mark.integration
@pytest.mark.parametrize("batching", ["budget", "5"])
def test_a_load_saved_before_every_worker_gave_a_batch_gives_each_document_once(
    docs: Manifest, batching: str
) -> None:
    """2 workers holding budget groups -> 3 workers, one batch (workers 1 and 2 have given
    none: their state is the load's, every held group) -> 1 worker: the held groups were
    given again by the merge of the workers that had not started (documents twice, no
    error)."""
    got, ld = run(docs, [("budget", 2, 5), (batching, 3, 1), (batching, 1, None)])
    assert twice(got) == []
    assert len(got) + ld.stats()["dropped_samples"] == 120


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Manifest]:
    """Mixture sources a (60 documents), b (40) and c (30)."""
    root = tmp_path_factory.mktemp("sources")
    sizes = {"a": 60, "b": 40, "c": 30}
    return {
        name: lognormal_shards(root / name, n=n, shards=2, seed=i)
        for i, (name, n) in enumerate(sizes.items())
    }


def mixed(parts: dict[str, Manifest], names: str, batching: str) -> ShardDataset:
    sets = [ShardDataset(parts[n], seed=2).shuffle(8) for n in names]
    ds = mix(sets, weights=[1] * len(names), names=list(names), stop="longest")
    if batching == "budget":
        return ds.batched(budget=3000, cost="tokens.npy", buffer=20)
    return ds.batched(int(batching))


def run_mixed(
    parts: dict[str, Manifest], legs: list[tuple[str, str, int, int | None, set[str]]]
) -> tuple[collections.Counter[str], WebLoader]:
    """Each leg: the sources, the batching, thread workers, batches (None: to the end) and
    the allow= of its load; returns how many documents of each source were given."""
    state: dict[str, Any] | None = None
    got: list[str] = []
    for names, batching, workers, steps, allow in legs:
        ld = WebLoader(mixed(parts, names, batching), num_workers=workers, worker_mode="thread")
        if state is not None:
            ld.load_state_dict(state, allow=allow)
        for n, batch in enumerate(ld, 1):
            pairs = zip(batch["__url__"], batch["__key__"], strict=True)
            got += [f"{u.split('/')[-2]}/{k}" for u, k in pairs]
            if n == steps:
                break
        state = json.loads(json.dumps(ld.state_dict()))
    assert twice(got) == []
    return collections.Counter(k.split("/")[0] for k in got), ld


@pytest.mark.integration
def test_exposure_after_a_load_saved_before_every_worker_gave_a_batch(
    sources: dict[str, Manifest],
) -> None:
    """A mixture on 2 workers -> 3 (one batch: workers 1 and 2 gave none, their mixture
    state the merge's, its counts the job's totals) -> 1: the merge summed the totals of
    every worker that had not started again: stats()['sources'] said a 142, b 98 for the
    60 and 40 given."""
    given, ld = run_mixed(
        sources, [("ab", "4", 2, 5, set()), ("ab", "4", 3, 1, set()), ("ab", "4", 1, None, set())]
    )
    exposure = {k: v["samples"] for k, v in ld.stats()["sources"].items()}
    assert exposure == dict(given) == {"a": 60, "b": 40}


@pytest.mark.integration
@pytest.mark.parametrize(("workers", "last"), [(2, 2), (3, 1)])
def test_dropped_samples_survive_the_next_load(
    sources: dict[str, Manifest], workers: int, last: int
) -> None:
    """a and b on 2 workers, 5 budget batches (each worker holds a group), then c added
    (its groups' rest left out, counted) on ``workers`` workers for 1 batch, then to the
    end on ``last`` workers: what was given plus stats()['dropped_samples'] is the 130
    documents. It said 0 dropped (a started worker's state did not keep the count); on
    3 workers -> 1 it said twice the count (workers 1 and 2 had given nothing since the
    load, each held the whole count, summed again by the merge)."""
    change = {"sources", "weights"}
    given, ld = run_mixed(
        sources,
        [
            ("ab", "budget", 2, 5, set()),
            ("abc", "budget", workers, 1, change),
            ("abc", "budget", last, None, set()),
        ],
    )
    assert sum(given.values()) + ld.stats()["dropped_samples"] == 130


@pytest.mark.integration
@pytest.mark.parametrize(
    "legs",
    [
        [("ab", "budget", 2, 5, set())],
        [("ab", "4", 2, 5, set()), ("ab", "4", 3, 1, set())],
        [("ab", "budget", 2, 5, set()), ("a", "budget", 2, 2, {"sources", "weights"})],
    ],
    ids=["budget-groups-held", "after-a-merge", "a-source-removed"],
)
def test_state_show_gives_the_exposure_the_loader_counts(
    sources: dict[str, Manifest],
    legs: list[tuple[str, str, int, int | None, set[str]]],
    tmp_path: Path,
) -> None:
    """`shardkit state show --json` said a 0, b 0 for the 7 and 2 budget batches gave
    (their groups held back from the mixture's counts), a 36, b 28 for 14 and 10 after a
    merge (every worker that gave nothing since held the job's totals), a 7 for 12 after
    a sources change."""
    _, ld = run_mixed(sources, legs)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(ld.state_dict()))
    got = CliRunner().invoke(cli, ["state", "show", "--json", str(path)], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    shown = {k: v["samples"] for k, v in json.loads(got.output)["sources"].items()}
    assert shown == {k: v["samples"] for k, v in ld.stats()["sources"].items()}


def by_node_leg(
    m: Manifest, world: int, workers: int, steps: int | None, state: dict[str, Any] | None
) -> tuple[list[str], dict[str, Any]]:
    """``world`` ranks (each its own loader, split_by_node(rank, world)) on ``workers``
    thread workers, each giving ``steps`` batches; their keys and the joined state."""
    states, got = [], []
    for rank in range(world):
        ds = ShardDataset(m, seed=3).split_by_node(rank, world)
        ld = WebLoader(
            ds.batched(budget=3000, cost="tokens.npy", buffer=20),
            num_workers=workers,
            worker_mode="thread",
        )
        if state is not None:
            ld.load_state_dict(state)
        for n, batch in enumerate(ld, 1):
            got += list(batch["__key__"])
            if n == steps:
                break
        states.append(ld.state_dict())
    return got, json.loads(json.dumps(WebLoader.merge_states(states)))


@pytest.mark.integration
def test_ranks_that_gave_no_batch_on_a_worker_since_a_load_give_each_document_once(
    docs: Manifest,
) -> None:
    """2 ranks x 2 workers -> 3 ranks x 2 (one batch a rank: every rank's worker 1 gave
    none) -> 1 rank: documents given twice before (each rank's worker 1 held every rank's
    groups)."""
    got: list[str] = []
    state = None
    for world, workers, steps in [(2, 2, 3), (3, 2, 1), (1, 1, None)]:
        keys, state = by_node_leg(docs, world, workers, steps, state)
        got += keys
    assert twice(got) == []
    assert len(got) >= 118  # the 3-rank re-plan leaves at most 2 as remainder


def _mix_of(state: dict[str, Any]) -> dict[str, Any]:
    while state.get("stage") != "mix":
        state = state["source"]
    return state


@pytest.mark.integration
@pytest.mark.parametrize(
    "edit",
    [
        lambda ws: _mix_of(ws).update(counts=[[1, 2]]),  # one source's counts cut
        lambda ws: _mix_of(ws).update(names=5),
        lambda ws: ws.update(given=[[0, "x", 1]]),
    ],
    ids=["counts-short", "names-no-list", "given-no-number"],
)
def test_state_show_names_a_hand_edited_mixture_state(
    sources: dict[str, Manifest], edit: Any, tmp_path: Path
) -> None:
    """Each was a traceback (IndexError, TypeError, ValueError) from `state show`."""
    _, ld = run_mixed(sources, [("ab", "budget", 2, 5, set())])
    state = ld.state_dict()
    ranks = json.loads(state["ranks"])
    edit(ranks[0]["workers"][0])
    path = tmp_path / "state.json"
    path.write_text(json.dumps({**state, "ranks": json.dumps(ranks)}))
    got = CliRunner().invoke(cli, ["state", "show", "--json", str(path)], catch_exceptions=False)
    assert got.exit_code == 1, got.output
    assert "rank 0 worker 0" in json.loads(got.output)["error"]


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("code ran",))


@pytest.mark.integration
def test_state_show_reads_a_torch_checkpoint_holding_numpy_arrays(
    docs: Manifest, tmp_path: Path
) -> None:
    """A trainer's checkpoint holds the numpy RNG state (a tuple with an array) beside the
    loader's: `state show` refused the whole file ('not a torch checkpoint that loads with
    weights_only=True'). Numbers load; an object array's items still run no code."""
    import numpy as np
    import torch

    ld = WebLoader(pipeline(docs, "4"))
    next(iter(ld))
    path = tmp_path / "ckpt.pt"
    extra = {"rng": np.random.get_state(), "x": np.float32(1.5), "ids": np.arange(3)}
    torch.save({"data": ld.state_dict(), **extra}, path)
    got = CliRunner().invoke(cli, ["state", "show", "--json", str(path)], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    assert json.loads(got.output)["epoch"] == 0
    objects = np.array([_Evil()], dtype=object)
    torch.save({"data": ld.state_dict(), "objects": objects}, path)
    got = CliRunner().invoke(cli, ["state", "show", "--json", str(path)], catch_exceptions=False)
    assert got.exit_code == 1 and "code ran" not in got.output


def test_finite_costs_whose_sum_overflows_a_float_are_batched(docs: Manifest) -> None:
    """Costs of 1e308 under a budget of 1.5e308 (each fits, two do not): an OverflowError
    ('cannot convert float infinity to integer': the group's cost summed to inf)."""
    ds = ShardDataset(docs, seed=3).batched(budget=1.5e308, cost=lambda s: 1e308, collate=list)
    batches = list(ds)
    assert [len(b) for b in batches] == [1] * 120


@pytest.mark.integration
@pytest.mark.parametrize("later", [[], [(1, 1), (2, None)]])
def test_dropped_samples_are_counted_when_the_batch_size_changes_too(
    sources: dict[str, Manifest], later: list[tuple[int, int | None]]
) -> None:
    """a and b on 2 workers, 5 budget batches (each worker holds a group), then c added and
    batched(4) on 2 workers to the end: 99 given, 0 dropped, for the 130 documents. Also
    when the batched(4) run saves after one batch and the rest runs on 1 worker, then 2
    (its count survives the loads and an elastic merge)."""
    change = {"sources", "weights", "batch_size"}
    legs = [("ab", "budget", 2, 5, set()), ("abc", "4", 2, 1 if later else None, change)]
    legs += [("abc", "4", w, steps, set()) for w, steps in later]
    given, ld = run_mixed(sources, legs)
    assert sum(given.values()) + ld.stats()["dropped_samples"] == 130


@pytest.mark.integration
def test_a_removed_sources_exposure_after_a_load_saved_before_every_worker_gave_a_batch(
    sources: dict[str, Manifest],
) -> None:
    """a and b on 2 workers -> 3 (one batch: workers 1 and 2 gave none, their mixture state
    the merge's totals) -> b removed: the removed source's exposure kept in
    stats()['sources'] summed the totals of every worker that had not started."""
    change = {"sources", "weights"}
    legs = [("ab", "4", 2, 2, set()), ("ab", "4", 3, 1, set()), ("a", "4", 2, None, change)]
    given, ld = run_mixed(sources, legs)
    exposure = {k: v["samples"] for k, v in ld.stats()["sources"].items()}
    assert exposure == dict(given)


@pytest.mark.integration
@pytest.mark.parametrize("workers", [(1, 1, 1), (2, 3, 1)])
def test_a_source_removed_and_added_back_gives_no_document_twice(
    sources: dict[str, Manifest], workers: tuple[int, int, int]
) -> None:
    """a and b, then b removed (its cursor kept in the job state's 'retired'), then b
    added back within the epoch, also on other worker counts: b goes on where it was (it
    started over: the documents it gave before its removal were given again), and its
    exposure is what it gave."""
    change = {"sources", "weights"}
    one, two, three = workers
    ab, a = ("ab", "4"), ("a", "4")
    legs = [(*ab, one, 5, set()), (*a, two, 3, change), (*ab, three, None, change)]
    given, ld = run_mixed(sources, legs)  # asserts no document twice
    assert sum(given.values()) + ld.stats()["dropped_samples"] == 100
    exposure = {k: v["samples"] for k, v in ld.stats()["sources"].items()}
    assert exposure == dict(given)
    assert "retired" not in ld.state_dict()


def removed_b(parts: dict[str, Manifest]) -> dict[str, Any]:
    """A job state of a and b, 5 batches, then b removed and 3 batches of a."""
    state: dict[str, Any] | None = None
    for names, allow in [("ab", set()), ("a", {"sources", "weights"})]:
        ld = WebLoader(mixed(parts, names, "4"), num_workers=0)
        if state is not None:
            ld.load_state_dict(state, allow=allow)
        for n, _ in enumerate(ld, 1):
            if n == (5 if names == "ab" else 3):
                break
        state = json.loads(json.dumps(ld.state_dict()))
    assert state is not None
    return state


@pytest.mark.integration
@pytest.mark.parametrize("how", ["other data", "old state"])
def test_a_source_added_back_starts_afresh_where_its_cursor_does_not_fit(
    sources: dict[str, Manifest], how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """b added back with other data behind its name (c's) starts afresh, and says so; a
    state saved before removed sources kept their cursors loads as before (afresh)."""
    state = removed_b(sources)
    assert set(state["retired"]["b"]) >= {"cursor", "fingerprint", "samples"}
    parts = dict(sources)
    if how == "other data":
        parts["b"] = sources["c"]
    else:
        state["retired"]["b"] = {
            k: state["retired"]["b"][k] for k in ("samples", "tokens", "epochs")
        }
    before = state["retired"]["b"]["samples"]
    ld = WebLoader(mixed(parts, "ab", "4"), num_workers=0)
    with caplog.at_level("WARNING", logger="shardkit.streaming.retired"):
        ld.load_state_dict(state, allow={"sources", "weights"})
    assert ("added back with other data" in caplog.text) == (how == "other data")
    keys = [
        k
        for batch in ld
        for u, k in zip(batch["__url__"], batch["__key__"], strict=True)
        if u.split("/")[-2] == ("c" if how == "other data" else "b")
    ]
    assert len(keys) == len(set(keys)) == (30 if how == "other data" else 40)
    assert ld.stats()["sources"]["b"]["samples"] == before + len(keys)


@pytest.mark.integration
def test_a_source_added_back_in_a_later_epoch_gives_that_epoch_whole(
    sources: dict[str, Manifest],
) -> None:
    """b removed in epoch 0, a to the epoch's end, b added back in epoch 1: b's cursor is
    of an epoch that ended, so b gives all its 40 documents in epoch 1, once each."""
    ld = WebLoader(mixed(sources, "a", "4"), num_workers=0)
    ld.load_state_dict(removed_b(sources), allow={"sources", "weights"})
    assert sum(len(b["__key__"]) for b in ld) > 0
    state = json.loads(json.dumps(ld.state_dict()))
    later = WebLoader(mixed(sources, "ab", "4"), num_workers=0)
    later.load_state_dict(state, allow={"sources", "weights"})
    later.set_epoch(1)
    got = [
        k
        for batch in later
        for u, k in zip(batch["__url__"], batch["__key__"], strict=True)
        if u.split("/")[-2] == "b"
    ]
    assert len(got) == len(set(got)) == 40


@pytest.mark.integration
def test_a_removed_sources_cursor_is_checked_and_not_shown(
    sources: dict[str, Manifest], tmp_path: Path
) -> None:
    """state show gives a removed source's exposure, not its kept cursor; a hand-edited
    cursor is refused by name."""
    state = removed_b(sources)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    got = CliRunner().invoke(cli, ["state", "show", "--json", str(path)], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    shown = json.loads(got.output)["sources"]["b"]
    assert shown["removed"] is True and "cursor" not in shown and "fingerprint" not in shown
    state["retired"]["b"]["cursor"] = [["x"]]
    ld = WebLoader(mixed(sources, "ab", "4"), num_workers=0)
    with pytest.raises(StateDictError, match="'retired' source 'b': a 'cursor' entry"):
        ld.load_state_dict(state, allow={"sources", "weights"})
