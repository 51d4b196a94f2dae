"""Exact resume in a new process, and elastic resume across world sizes and worker counts.

The child process is this module run with ``python -m``: it rebuilds the same pipeline,
loads each saved state and writes the batches it yields (and the bytes it read).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.format.manifest.model import Manifest

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]
ROOT = Path(__file__).resolve().parents[2]
BUFSIZE = 16


def make_loader(manifest: str, workers: int, rank: int = 0, world: int = 1) -> WebLoader:
    ds = (
        ShardDataset(manifest, seed=11)
        .split_by_node(rank, world)
        .shuffle(BUFSIZE)
        .to_tuple("__key__")
        .batched(3)
    )
    ctx = "fork" if workers else None
    return WebLoader(ds, num_workers=workers, multiprocessing_context=ctx)


def keys_of(batches: Any) -> list[list[str]]:
    return [list(b[0]) for b in batches]


def child(manifest: str, workers: int, states: list[str], out: str) -> None:
    """In a new process: resume from each state file, record the tail and bytes read."""
    results = []
    for path in states:
        loader = make_loader(manifest, workers)
        with open(path, encoding="utf-8") as f:
            loader.load_state_dict(json.load(f))
        tail = keys_of(loader)
        results.append({"tail": tail, "bytes": loader.stats()["bytes"]})
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_in_a_new_process_yields_the_identical_tail(
    make_shards: MakeShards, tmp_path: Path, workers: int
) -> None:
    m = make_shards([40, 25, 61, 30, 44], tokens=256)
    manifest = str(Path(m.base or "") / "manifest.json")
    full_loader = make_loader(manifest, workers)
    full = keys_of(full_loader)
    full_bytes = full_loader.stats()["bytes"]
    rng = random.Random(workers)
    stops = sorted({1, len(full) - 1, *(rng.randrange(2, len(full) - 1) for _ in range(3))})
    files = []
    for stop in stops:
        loader = make_loader(manifest, workers)
        it = iter(loader)
        head = [list(next(it)[0]) for _ in range(stop)]
        assert head == full[:stop]
        path = tmp_path / f"state-{stop}.json"
        path.write_text(json.dumps(loader.state_dict()))
        files.append(str(path))
        del it
    out = tmp_path / "tails.json"
    cmd = [sys.executable, "-m", "tests.streaming.test_resume", manifest, str(workers), str(out)]
    subprocess.run([*cmd, *files], cwd=ROOT, check=True, timeout=240)
    results = json.loads(out.read_text())
    per_sample = full_bytes / sum(len(b) for b in full)
    for stop, res in zip(stops, results, strict=True):
        assert res["tail"] == full[stop:], f"stop {stop}: the resumed tail differs"
        # resume seeks: it reads what is left plus at most a shuffle window per worker
        left = sum(len(b) for b in full[stop:])
        slack = max(workers, 1) * (BUFSIZE + 8)
        assert res["bytes"] <= (left + slack) * per_sample, f"stop {stop}: re-read consumed data"


@pytest.mark.parametrize(("old", "new"), [((2, 2), (3, 1)), ((2, 2), (2, 1))])
def test_elastic_resume_reads_every_sample_of_the_epoch_once(
    make_shards: MakeShards, old: tuple[int, int], new: tuple[int, int]
) -> None:
    """Saved at world x workers ``old``, loaded at ``new``: the epoch is read exactly once."""
    m = make_shards([17, 30, 9, 21, 12, 19, 12])  # 120 samples: 30 per old worker
    manifest = str(Path(m.base or "") / "manifest.json")
    for stop in (1, 4, 7):
        consumed: list[str] = []
        saved = []
        for rank in range(old[0]):  # the ranks of the old run (no process group)
            loader = make_loader(manifest, old[1], rank, old[0])
            it = iter(loader)
            consumed += [k for _ in range(stop + rank) for k in next(it)[0]]  # not in lockstep
            saved.append(json.loads(json.dumps(loader.state_dict())))
            del it
        state = WebLoader.merge_states(saved)
        after: list[str] = []
        lengths = set()
        for rank in range(new[0]):
            loader = make_loader(manifest, new[1], rank, new[0])
            loader.load_state_dict(state or {})
            mine = [k for b in loader for k in b[0]]
            lengths.add(len(mine))
            after += mine
        assert max(lengths) - min(lengths) <= 1, f"stop {stop}: new ranks got {lengths}"
        both = consumed + after
        assert len(set(both)) == len(both), f"stop {stop}: a sample was read twice"
        lost = {f"sample-{i:08d}" for i in range(120)} - set(both)
        assert len(lost) < new[0], f"stop {stop}: lost {lost} beyond the remainder rule"


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]), sys.argv[4:], sys.argv[3])


def test_elastic_resumes_chain_even_before_every_worker_reported(make_shards: MakeShards) -> None:
    """2x2 -> 3x2 (saved when only worker 0 of each rank had sent a batch) -> 3x1."""
    m = make_shards([17, 30, 9, 21, 12, 19, 12])
    manifest = str(Path(m.base or "") / "manifest.json")
    consumed: list[str] = []
    state: dict[str, Any] = {}
    for world, workers, stop in ((2, 2, 1), (3, 2, 1), (3, 1, None)):
        saved = []
        for rank in range(world):
            loader = make_loader(manifest, workers, rank, world)
            if state:
                loader.load_state_dict(state)
            it = iter(loader)
            for taken, batch in enumerate(it, start=1):
                consumed += list(batch[0])
                if taken == stop:
                    break
            saved.append(json.loads(json.dumps(loader.state_dict())))
            del it
        state = WebLoader.merge_states(saved)
    assert sorted(consumed) == [f"sample-{i:08d}" for i in range(120)]
