"""Mixtures (issue 21) on real shards: names, schedules followed within a derived bound,
per-source epochs (each its own permutation), with_epoch's nominal epochs, exposure equal to
what was given, exact resume at every point."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit import Schedule, ShardDataset, mix
from shardkit.errors import ConfigError
from shardkit.format.manifest.model import Manifest
from shardkit.stages.mixture import mix_state
from tests.helpers.resumable import assert_resumable

MakeShards = Callable[..., Manifest]
DELTA = 1e-9


def bound(n: int) -> float:
    """Azuma-Hoeffding: a count over n draws stays within this of its expectation but with
    probability DELTA (the draws' uniforms are independent of the items)."""
    return math.sqrt(n * math.log(2 / DELTA) / 2)


def origin(sample: dict[str, Any]) -> str:
    return str(sample["__url__"]).rsplit("/", 1)[1].split("-")[0]


def ident(sample: dict[str, Any]) -> str:
    return f"{origin(sample)}:{sample['__key__']}"


@pytest.fixture
def sets(make_shards: MakeShards) -> dict[str, Manifest]:
    return {
        "web": make_shards([6, 9], prefix="web"),
        "code": make_shards([4, 3], prefix="code", seed=1),
        "math": make_shards([5], prefix="math", seed=2),
    }


def datasets(sets: dict[str, Manifest]) -> dict[str, ShardDataset]:
    return {name: ShardDataset(m, seed=3).shuffle(4) for name, m in sets.items()}


def test_names_come_from_a_dict_from_names_or_by_position(sets: dict[str, Manifest]) -> None:
    ds = mix(datasets(sets), {"web": 2, "code": 1, "math": 1}, stop="longest")
    assert Counter(origin(s) for s in ds) == {"web": 15, "code": 7, "math": 5}
    st = mix_state(ds.state_dict()["state"])
    assert st is not None and st["names"] == ["web", "code", "math"]
    assert [c[0] for c in st["counts"]] == [15, 7, 5]  # exposure: what each source gave
    plain = mix(list(datasets(sets).values()), [1, 1, 1])
    assert mix_state(plain.state_dict()["state"])["names"] == ["source0", "source1", "source2"]  # type: ignore[index]
    named = mix(list(datasets(sets).values()), names=["a", "b", "c"])
    assert mix_state(named.state_dict()["state"])["names"] == ["a", "b", "c"]  # type: ignore[index]
    with pytest.raises(ConfigError, match="unknown sources"):
        mix(datasets(sets), {"books": 1})
    with pytest.raises(ConfigError, match="names"):
        mix(datasets(sets), names=["x", "y", "z"])
    with pytest.raises(ConfigError, match="stop"):
        mix(datasets(sets), stop="shortest")
    with pytest.raises(ConfigError, match="tokens_field"):
        list(mix(datasets(sets), Schedule([(0, [1, 1, 1])], unit="tokens")))
    with pytest.raises(ConfigError, match="disagree"):
        mix(datasets(sets), stop="first", longest=True)


def test_the_mixture_is_a_pure_function_of_the_seed(sets: dict[str, Manifest]) -> None:
    def run(seed: int) -> list[str]:
        ds = mix(datasets(sets), [1, 1, 1], seed=seed, stop="never").with_epoch(60)
        return [ident(s) for s in ds]

    assert run(5) == run(5)
    assert run(5) != run(6)


@settings(  # the shards are only read: one set for every example
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**31), at=st.integers(50, 250), w=st.integers(1, 9))
def test_realized_shares_follow_a_step_schedule(
    sets: dict[str, Manifest], seed: int, at: int, w: int
) -> None:
    schedule = Schedule([(0, {"web": 10 - w, "code": w}), (at, {"code": 1, "math": 3})])
    ds = mix(datasets(sets), schedule, seed=seed, stop="never").with_epoch(400)
    got = [origin(s) for s in ds]
    assert len(got) == 400
    for lo, hi in ((0, at), (at, 400)):
        weights = schedule.bind(["web", "code", "math"]).weights_at(lo)
        window = Counter(got[lo:hi])
        for k, name in enumerate(["web", "code", "math"]):
            assert abs(window[name] - weights[k] * (hi - lo)) <= bound(hi - lo), (name, lo)
            if weights[k] == 0:
                assert window[name] == 0


def test_linear_schedule_moves_the_shares(sets: dict[str, Manifest]) -> None:
    schedule = Schedule([(0, [1, 0, 0]), (600, [0, 0, 1])], interpolate="linear")
    ds = mix(datasets(sets), schedule, seed=2, stop="never").with_epoch(600)
    got = [origin(s) for s in ds]
    first, last = Counter(got[:200]), Counter(got[400:])
    assert first["web"] > 150 and last["math"] > 150 and got.count("code") == 0


def test_each_source_runs_its_own_epochs(sets: dict[str, Manifest]) -> None:
    """Under stop="never" a source that ran out starts its next epoch (its own reshuffle):
    its items over two of its epochs are exactly two permutations of it."""
    ds = mix(datasets(sets), [1, 3, 1], seed=1, stop="never").with_epoch(200)
    code = [ident(s) for s in ds if origin(s) == "code"]
    assert len(code) > 14
    one, two = code[:7], code[7:14]
    assert sorted(one) == sorted(two) == sorted({*one}) and len(set(one)) == 7
    assert one != two  # reshuffled
    st = mix_state(ds.state_dict()["state"])
    assert st is not None
    assert st["epochs"][1] == sum(1 for _ in code) // 7  # its own epoch counter
    assert st["counts"][1][0] == len(code)


def test_with_epoch_makes_nominal_epochs_that_go_on(sets: dict[str, Manifest]) -> None:
    ds = mix(datasets(sets), [1, 1, 1], seed=4, stop="never").with_epoch(30)
    assert len(ds) == 30
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append([ident(s) for s in ds])
    assert [len(e) for e in epochs] == [30, 30, 30]
    web = [i for e in epochs for i in e if i.startswith("web")]
    # the nominal epochs go on: web's items read across them are whole permutations in turn
    for lo in range(0, len(web) - 15 + 1, 15):
        assert len(set(web[lo : lo + 15])) == 15
    st = mix_state(ds.state_dict()["state"])
    assert st is not None and sum(c[0] for c in st["counts"]) == 90  # exposure carried
    batched = mix(datasets(sets), stop="never").to_tuple("__key__").batched(4).with_epoch(5)
    assert len(batched) == 5 and len(list(batched)) == 5


def resumable(sets: dict[str, Manifest]) -> dict[str, Callable[[], ShardDataset]]:
    steps = Schedule([(0, {"web": 1}), (20, {"code": 2, "math": 1}), (45, {"web": 1, "math": 1})])
    tokens = Schedule([(0, [1, 0, 1]), (3000, [0, 1, 1])], unit="tokens", interpolate="linear")
    return {
        "schedule-never": lambda: mix(datasets(sets), steps, seed=2, stop="never").with_epoch(70),
        "longest-batched": lambda: (
            mix(datasets(sets), steps, stop="longest").to_tuple("__key__").batched(3)
        ),
        "tokens-packed": lambda: (
            mix(
                {k: v.decode() for k, v in datasets(sets).items()},
                tokens,
                stop="never",
                tokens_field="tokens.npy",
            )
            .pack_tokens("tokens.npy", 96, strategy="best_fit", buffer=4, boundaries=True)
            .with_epoch(25)
        ),
    }


@pytest.mark.parametrize("name", ["schedule-never", "longest-batched", "tokens-packed"])
def test_mixtures_resume_exactly(sets: dict[str, Manifest], name: str) -> None:
    make = resumable(sets)[name]
    assert_resumable(make, rounds=5, seed=len(name), prepare=lambda d: d.set_epoch(1))


def test_every_point_of_a_short_scheduled_mixture_resumes(sets: dict[str, Manifest]) -> None:
    steps = Schedule([(0, [1, 0, 1]), (9, [0, 1, 1]), (25, [3, 1, 0])])
    assert_resumable(
        lambda: mix(datasets(sets), steps, seed=5, stop="never").with_epoch(36), stops=range(37)
    )


def test_pack_tokens_after_a_mix_counts_tokens(sets: dict[str, Manifest]) -> None:
    srcs = {k: v.decode() for k, v in datasets(sets).items()}
    ds = mix(srcs, stop="longest").pack_tokens("tokens.npy", 50, strategy="best_fit")
    seqs = list(ds)
    st = mix_state(ds.state_dict()["state"]["source"])
    assert st is not None
    docs = list(mix(srcs, stop="longest"))
    assert sum(c[1] for c in st["counts"]) == sum(len(d["tokens.npy"]) for d in docs) > 0
    assert sum(int((s != 0).sum()) for s in seqs) > 0
