"""A ``shardkit build`` killed with SIGKILL mid-shard leaves only whole shards; ``--resume``
finishes it with every sample exactly once (the same shard bytes as a build never killed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardkit.format.manifest.model import Manifest, incomplete_reason
from shardkit.write.build import build
from shardkit.write.inputs.sources import parse_field_spec
from tests.helpers.readback import (
    assert_whole,
    hidden_leftovers,
    shard_digests,
    shardkit,
    write_jsonl,
)

pytestmark = pytest.mark.integration

ARGS = ["--maxsize", "512KB", "--field", "tokens=npy:int32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6k records in 6 JSONL files: ~30 shards of 512 KB."""
    root = tmp_path_factory.mktemp("crash") / "raw"
    rng = np.random.default_rng(3)
    for f in range(6):
        write_jsonl(
            root / f"part{f}.jsonl",
            ({"i": i, "tokens": rng.integers(0, 32_000, size=100).tolist()} for i in range(1000)),
        )
    return root


@pytest.fixture(scope="module")
def reference(corpus: Path) -> Callable[[int], list[tuple[str, str, int]]]:
    """The shards of an uninterrupted build with 1 or 2 workers (built once each)."""
    made: dict[int, list[tuple[str, str, int]]] = {}

    def get(workers: int) -> list[tuple[str, str, int]]:
        if workers not in made:
            out = corpus.parent / f"reference-{workers}"
            res = build(
                [str(corpus)],
                out,
                maxsize="512KB",
                fields=(parse_field_spec("tokens=npy:int32"),),
                workers=workers,
            )
            assert res.manifest.total_samples == 6_000
            made[workers] = shard_digests(res.manifest_path)
        return made[workers]

    return get


def _start(
    corpus: Path, out: Path, *extra: str, new_session: bool = False
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "shardkit", "build", str(corpus), "-o", str(out), *ARGS, *extra]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # killed on purpose: nothing to read
        start_new_session=new_session,
    )


def _wait_until(proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    """Poll the build's output until ``ready``; fail if the build ends first."""
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline, "the build never got there"
        time.sleep(0.002)


def _listed(path: Path) -> int:
    try:
        return len(Manifest.load(path))
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def _resume(corpus: Path, out: Path, *extra: str) -> None:
    r = shardkit("build", corpus, "-o", out, *ARGS, *extra)
    assert r.returncode == 0, r.stderr
    assert not hidden_leftovers(out)  # no temp file, no work dir


def test_sigkill_mid_shard_then_resume(
    corpus: Path, reference: Callable[[int], list[tuple[str, str, int]]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    manifest = out / "manifest.json"
    proc = _start(corpus, out)

    def mid_shard() -> bool:
        # two shards listed and the next one open in its temporary file
        return _listed(manifest) >= 2 and any(".tmp-" in n for n in os.listdir(out))

    _wait_until(proc, mid_shard)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    full = reference(1)
    m = assert_whole(manifest)
    assert 2 <= len(m) < len(full)
    assert shard_digests(manifest) == full[: len(m)]  # exactly the first shards, byte for byte
    listed = (
        {s.url for s in m}
        | {s.index for s in m}
        | {"manifest.json", "manifest.csv", "manifest.json.cols"}
    )
    for name in set(os.listdir(out)) - listed:
        # a temp file, or a shard renamed just before the kill but not yet listed
        assert name.startswith(".") or int(name.split("-")[1][:6]) >= len(m), name
    _resume(corpus, out, "--resume")
    assert shard_digests(manifest) == full
    assert_whole(manifest)


def test_sigkill_of_a_parallel_build_then_resume(
    corpus: Path, reference: Callable[[int], list[tuple[str, str, int]]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    work = out / ".data.work"
    proc = _start(corpus, out, "--workers", "2", new_session=True)

    def both_writing() -> bool:
        return all(_listed(work / f"w{i:04d}" / "manifest.json") >= 1 for i in range(2))

    _wait_until(proc, both_writing)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job, workers included
    proc.wait()
    # never finalised: a manifest of no shards that says so and names --resume
    said = incomplete_reason(Manifest.load(out / "manifest.json"))
    assert said is not None and "did not finish" in said and "--resume" in said
    for i in range(2):
        assert_whole(work / f"w{i:04d}" / "manifest.json")
    _resume(corpus, out, "--workers", "2", "--resume")
    assert shard_digests(out / "manifest.json") == reference(2)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_stop_when_the_main_process_is_killed(
    corpus: Path, reference: Callable[[int], list[tuple[str, str, int]]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    work = out / ".data.work"
    proc = _start(corpus, out, "--workers", "2")
    _wait_until(proc, lambda: _listed(work / "w0000" / "manifest.json") >= 1)
    kids = _children(proc.pid)
    assert len(kids) >= 2
    proc.send_signal(signal.SIGKILL)  # only the main process
    proc.wait()
    deadline = time.monotonic() + 60
    while not all(_gone(k) for k in kids):  # orphaned workers notice and stop by themselves
        assert time.monotonic() < deadline, "workers kept running after the main process died"
        time.sleep(0.01)
    _resume(corpus, out, "--workers", "2", "--resume")
    assert shard_digests(out / "manifest.json") == reference(2)
