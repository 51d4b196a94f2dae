"""Mixtures through the WebLoader (issue 21): exposure in stats and state, reweighting
across a resume, elastic resume with a schedule, with_epoch nominal epochs with workers,
and equal batch counts on 2 gloo ranks with an endless mixture."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shardkit import Schedule, ShardDataset, StateDictError, WebLoader, mix
from shardkit.format.manifest.model import Manifest
from shardkit.metrics import job_summary
from shardkit.metrics.export import prometheus_text
from tests.helpers.data import make_shards
from tests.helpers.ranks import run_ranks

MakeShards = Callable[..., Manifest]
NAMES = ["web", "code", "math"]


def make_sets(root: Path) -> dict[str, str]:
    sizes = {"web": [20, 17], "code": [9, 8], "math": [12]}
    for i, (name, n) in enumerate(sizes.items()):
        make_shards(root / name, n, prefix=name, seed=i)
    return {name: str(root / name / "manifest.json") for name in sizes}


@pytest.fixture
def sets(tmp_path: Path) -> dict[str, str]:
    return make_sets(tmp_path)


def loader(
    sets: dict[str, str],
    weights: Any = None,
    *,
    stop: str = "longest",
    workers: int = 2,
    rank: int = 0,
    world: int = 1,
    epoch_len: int | None = None,
    seed: int = 0,
) -> WebLoader:
    srcs = {
        k: ShardDataset(m, seed=5).split_by_node(rank, world).shuffle(4) for k, m in sets.items()
    }
    ds = mix(srcs, weights, seed=seed, stop=stop).to_tuple("__key__", "__url__").batched(3)
    if epoch_len is not None:
        ds = ds.with_epoch(epoch_len)
    ctx = "fork" if workers else None
    return WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)


def idents(batch: Any) -> list[str]:
    return [
        f"{u.rsplit('/', 1)[1].split('-')[0]}:{k}" for k, u in zip(batch[0], batch[1], strict=True)
    ]


def counts(items: list[str]) -> dict[str, int]:
    c = Counter(i.split(":")[0] for i in items)
    return {n: c[n] for n in NAMES}


def test_stats_report_what_each_source_gave(sets: dict[str, str]) -> None:
    schedule = Schedule([(0, {"web": 3, "code": 1}), (30, {"math": 1, "code": 1})])
    lo = loader(sets, schedule)
    got: list[str] = []
    for step, batch in enumerate(lo):
        got += idents(batch)
        if step == 5:
            stats = lo.stats()["sources"]
            assert {n: stats[n]["samples"] for n in NAMES} == counts(got)
    stats = lo.stats()["sources"]
    assert {n: stats[n]["samples"] for n in NAMES} == counts(got)
    assert counts(got)["math"] == 12 and counts(got)["code"] == 17  # read to their ends
    assert counts(got)["web"] < 37  # weight 0 from 30 on: never drawn again
    assert sum(s["share"] for s in stats.values()) == pytest.approx(1.0)
    assert stats["math"]["share"] == pytest.approx(12 / len(got))
    assert stats["math"]["weight"] == 0.5 and stats["web"]["weight"] == 0.0  # the schedule now
    assert stats["web"]["epochs"] == 0


def test_exposure_is_kept_in_the_state(sets: dict[str, str]) -> None:
    lo = loader(sets, [2, 1, 1])
    it = iter(lo)
    head = [i for _ in range(4) for i in idents(next(it))]
    state = json.loads(json.dumps(lo.state_dict()))
    del it
    again = loader(sets, [2, 1, 1])
    again.load_state_dict(state)
    assert {n: again.stats()["sources"][n]["samples"] for n in NAMES} == counts(head)
    tail = [i for b in again for i in idents(b)]
    assert len(set(head + tail)) == len(head + tail) == 66
    assert {n: again.stats()["sources"][n]["samples"] for n in NAMES} == counts(head + tail)


def test_reweight_goes_on_with_new_weights_and_replays_nothing(sets: dict[str, str]) -> None:
    lo = loader(sets, {"web": 1, "code": 1, "math": 1}, stop="first", workers=0)
    it = iter(lo)
    head = [i for _ in range(3) for i in idents(next(it))]
    state = json.loads(json.dumps(lo.state_dict()))
    del it
    new = {"web": 0, "code": 0, "math": 1}
    refused = loader(sets, new, stop="first", workers=0)
    with pytest.raises(StateDictError, match="schedule"):
        refused.load_state_dict(state)
    again = loader(sets, new, stop="first", workers=0)
    again.load_state_dict(state, reweight=True)
    tail = [i for b in again for i in idents(b)]
    assert not set(head) & set(tail)  # nothing given before is given again
    assert {i.split(":")[0] for i in tail} == {"math"}  # the new weights from here on
    assert len(set(head + tail)) == len(head) + len(tail)
    assert counts(head)["math"] + len(tail) == 12  # math went on from its cursor to its end
    resaved = again.state_dict()
    loader(sets, new, stop="first", workers=0).load_state_dict(resaved)  # fits the new one
    reordered = {
        k: ShardDataset(sets[k], seed=5).split_by_node(0, 1).shuffle(4) for k in reversed(NAMES)
    }
    ds = mix(reordered, new, stop="first").to_tuple("__key__", "__url__").batched(3)
    by_name = WebLoader(ds)
    by_name.load_state_dict(state, reweight=True)  # the same sources by name, other order
    assert [i for b in by_name for i in idents(b)] == tail


@pytest.mark.parametrize("reweight", [False, True])
def test_elastic_resume_with_a_schedule_reads_nothing_twice(
    sets: dict[str, str], reweight: bool
) -> None:
    schedule = Schedule([(0, [1, 1, 0.1]), (20, [1, 2, 3])], interpolate="linear")
    later = Schedule([(0, [1, 1, 1]), (40, [3, 1, 1])]) if reweight else schedule
    lo = loader(sets, schedule, workers=2)
    it = iter(lo)
    head = [i for _ in range(5) for i in idents(next(it))]
    state = json.loads(json.dumps(lo.state_dict()))
    del it
    tails, exposure = [], Counter[str]()
    for rank in range(2):
        again = loader(sets, later, workers=1, rank=rank, world=2)
        again.load_state_dict(state, reweight=reweight)
        tails += [i for b in again for i in idents(b)]
        exposure.update({n: again.stats()["sources"][n]["samples"] for n in NAMES})
    both = head + tails
    assert len(set(both)) == len(both)  # nothing read twice
    assert dict(exposure) == counts(both)  # the job's exposure: old totals + what came after
    assert len(both) >= 66 - 2 * 3 * 2  # at most each source's split remainder is left out


def test_with_epoch_nominal_epochs_with_workers(sets: dict[str, str]) -> None:
    lo = loader(sets, [1, 1, 1], stop="never", workers=2, epoch_len=7)
    assert len(lo) == 7
    per_epoch = []
    for epoch in range(3):
        lo.set_epoch(epoch)
        per_epoch.append([i for b in lo for i in idents(b)])
    assert [len(e) for e in per_epoch] == [21, 21, 21]
    assert sum(lo.stats()["sources"][n]["samples"] for n in NAMES) == 63  # carried over
    # saved after epoch 1 ended, epoch 2 starts where the endless mixture was
    lo2 = loader(sets, [1, 1, 1], stop="never", workers=2, epoch_len=7)
    for epoch in range(2):
        lo2.set_epoch(epoch)
        list(lo2)
    state = json.loads(json.dumps(lo2.state_dict()))
    lo3 = loader(sets, [1, 1, 1], stop="never", workers=2, epoch_len=7)
    lo3.load_state_dict(state)
    lo3.set_epoch(2)
    assert [i for b in lo3 for i in idents(b)] == per_epoch[2]


def _endless_rank(root: str, rank: int) -> dict[str, Any]:
    sets = {k: str(Path(root) / k / "manifest.json") for k in NAMES}
    lo = loader(sets, [5, 1, 1], stop="never", workers=2, rank=rank, world=2, epoch_len=9)
    out: dict[str, Any] = {"batches": [], "len": len(lo)}
    for epoch in range(2):
        lo.set_epoch(epoch)
        n = 0
        for _ in lo:
            dist.all_reduce(torch.ones(1))  # a gradient all-reduce stand-in
            n += 1
        out["batches"].append(n)
    out["sources"] = lo.stats()["sources"]
    out["job"] = job_summary(lo.stats())["sources"]  # a collective: every rank calls it
    return out


@pytest.mark.integration
def test_endless_mixture_gives_equal_batches_on_every_rank(tmp_path: Path) -> None:
    make_sets(tmp_path / "data")
    results = run_ranks(functools.partial(_endless_rank, str(tmp_path / "data")), 2, tmp_path)
    assert [r["batches"] for r in results] == [[9, 9], [9, 9]]
    assert [r["len"] for r in results] == [9, 9]
    assert all(sum(s["samples"] for s in r["sources"].values()) == 2 * 9 * 3 for r in results)
    for name in NAMES:  # the job's exposure: the ranks' summed, the same on every rank
        job = results[0]["job"][name]
        assert job == results[1]["job"][name]
        assert job["samples"] == sum(r["sources"][name]["samples"] for r in results)
        assert job["epochs"] == max(r["sources"][name]["epochs"] for r in results)
    assert sum(results[0]["job"][n]["share"] for n in NAMES) == pytest.approx(1.0)


def test_exposure_is_exported_with_a_source_label(sets: dict[str, str]) -> None:
    lo = loader(sets, [1, 1, 1], workers=0)
    got = [i for b in lo for i in idents(b)]
    text = prometheus_text(lo.stats(), rank=0)
    for name, n in counts(got).items():
        assert f'shardkit_loader_source_samples_total{{rank="0",source="{name}"}} {n}' in text
    assert 'shardkit_loader_source_weight{rank="0",source="web"}' in text
    job = job_summary(lo.stats())["sources"]  # without a process group: a job of one rank
    assert {n: job[n]["samples"] for n in NAMES} == counts(got)


def test_exposure_reads_back_from_tensorboard(sets: dict[str, str], tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from shardkit.metrics.export import tensorboard

    lo = loader(sets, [1, 1, 1], workers=0)
    got = [i for b in lo for i in idents(b)]
    writer = SummaryWriter(str(tmp_path / "tb"))
    tensorboard(writer, lo.stats(), 7)
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    for name, n in counts(got).items():
        assert [e.value for e in acc.Scalars(f"data/source/{name}/samples")] == [n]
    assert {f"data/source/web/{k}" for k in ("tokens", "epochs", "share", "weight")} <= set(
        acc.Tags()["scalars"]
    )


@pytest.mark.parametrize(("stop", "epoch_len"), [("longest", None), ("never", 12)])
def test_a_state_saved_after_set_epoch_starts_that_epoch(
    sets: dict[str, str], stop: str, epoch_len: int | None
) -> None:
    """A checkpoint taken between epochs (after ``set_epoch(n + 1)``, before iterating) is
    the start of epoch n + 1, what the pipeline carries over included: loaded into a new
    loader it gives exactly what the first loader gives (it was refused as "a worker state
    for epoch n in a state for epoch n + 1")."""
    first = loader(sets, [0.5, 0.3, 0.2], stop=stop, epoch_len=epoch_len)
    assert len([idents(b) for b in first]) > 0
    first.set_epoch(1)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["epoch"] == 1 and not state["complete"]
    want = [idents(b) for b in first]
    again = loader(sets, [0.5, 0.3, 0.2], stop=stop, epoch_len=epoch_len)
    again.load_state_dict(state)
    again.set_epoch(1)
    assert [idents(b) for b in again] == want and want
    assert again.stats()["sources"] == first.stats()["sources"]
