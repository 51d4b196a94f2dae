"""ShardDataset under transformers.Trainer and accelerate: every sample once, or a refusal.

The Trainer runs are examples/hf_trainer.py under torchrun (2 gloo processes on CPU, a tiny
model that writes down the ids it trains on); the accelerate run is
tests/helpers/accelerate_loop.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _torchrun(script: Path, *args: str | Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        [*cmd, str(script), *map(str, args)], capture_output=True, text=True, timeout=280
    )
    if ok:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _trainer(tmp: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return _torchrun(
        ROOT / "examples" / "hf_trainer.py",
        "--data",
        tmp / "data",
        "--run-dir",
        tmp / "run",
        "--seen-log",
        tmp / "seen",
        *args,
        ok=ok,
    )


def _seen(tmp: Path) -> tuple[Counter[int], list[int]]:
    """Every id trained on (all ranks) and each rank's number of steps."""
    counts: Counter[int] = Counter()
    steps = []
    for rank in range(2):
        lines = (tmp / f"seen.{rank}").read_text().splitlines()
        steps.append(len(lines))
        counts.update(i for line in lines for i in json.loads(line))
    return counts, steps


def test_trainer_trains_every_sample_once_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """accelerate's default (rank 0 reads, dispatches), 2 DataLoader workers, stopped at
    step 13 of 40 and resumed from the Trainer's checkpoint."""
    _trainer(tmp_path, "--workers", "2", "--stop-at", "13")
    assert _seen(tmp_path)[1] == [13, 13]
    _trainer(tmp_path, "--workers", "2", "--resume")
    counts, steps = _seen(tmp_path)
    assert steps == [40, 40]
    assert sorted(counts) == list(range(320)) and set(counts.values()) == {1}


def test_trainer_without_dispatch_trains_every_sample_once(tmp_path: Path) -> None:
    _trainer(tmp_path, "--no-dispatch")
    counts, steps = _seen(tmp_path)
    assert steps == [40, 40]
    assert sorted(counts) == list(range(320)) and set(counts.values()) == {1}


def test_trainer_refuses_a_data_set_that_splits_by_node(tmp_path: Path) -> None:
    """Before: 67 of 320 samples trained twice in the epoch, silently."""
    r = _trainer(tmp_path, "--split-by-node", ok=False)
    assert r.returncode != 0
    assert "Drop .split_by_node()" in r.stderr and "dispatch_batches" in r.stderr
    assert not (tmp_path / "seen.0").exists(), "a step ran on wrongly split data"


def _data(tmp: Path, n: int) -> str:
    with sk.ShardWriter(tmp, maxcount=10) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:04d}", "json": {"id": i}})
    return str(tmp / "manifest.json")


def test_accelerates_own_split_refuses_split_by_node_and_warns_of_a_padded_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """dispatch_batches=False wraps the data set in IterableDatasetShard: every rank reads
    it whole and keeps its own batches, so a split by node would lose half the data; and
    with drop_last off it pads the last step with the epoch's first samples."""

    from accelerate.data_loader import IterableDatasetShard  # heavy: not at collection

    path = _data(tmp_path, 36)
    split = sk.ShardDataset(path).split_by_node(rank=0, world_size=2)
    wrapped = IterableDatasetShard(split, batch_size=4, num_processes=2, process_index=0)
    with pytest.raises(ConfigError, match=r"Drop \.split_by_node"):
        len(wrapped)
    with pytest.raises(ConfigError, match="IterableDatasetShard"):
        list(wrapped)
    whole = sk.ShardDataset(path)
    padded = IterableDatasetShard(whole, batch_size=4, num_processes=2, process_index=1)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        assert len(list(padded)) == 20  # 16 + 4 from the epoch's start: trained twice
    assert "36 items, not a multiple of the 8" in caplog.text, "a silent repeat"
    dropped = IterableDatasetShard(
        whole, batch_size=4, num_processes=2, process_index=1, drop_last=True
    )
    assert len(dropped) == 16 and len(list(dropped)) == 16
    even = _data(tmp_path / "even", 32)
    ids = [
        s["__key__"]
        for r in range(2)
        for s in IterableDatasetShard(
            sk.ShardDataset(even), batch_size=4, num_processes=2, process_index=r
        )
    ]
    assert sorted(ids) == [f"s{i:04d}" for i in range(32)]
    whole.set_epoch(1)  # outside accelerate: nothing to refuse


def test_a_webloader_through_accelerator_prepare_is_exact(tmp_path: Path) -> None:
    path = _data(tmp_path, 50)
    out = tmp_path / "ids"
    _torchrun(ROOT / "tests" / "helpers" / "accelerate_loop.py", path, out)
    per_rank = [json.loads((tmp_path / f"ids.{r}").read_text()) for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1])
    ids = [i for rank in per_rank for batch in rank for i in batch]
    assert sorted(ids) == list(range(50))


def test_lightning_ddp_resumes_mid_epoch_from_its_checkpoint_exactly(tmp_path: Path) -> None:
    """examples/lightning_ddp.py: a WebLoader in the data module, stopped at step 7 of 20
    and resumed from Lightning's checkpoint (which holds the loader's state_dict)."""
    pytest.importorskip("lightning")
    script = ROOT / "examples" / "lightning_ddp.py"
    args = ["--data", tmp_path / "data", "--run-dir", tmp_path / "run"]
    args += ["--seen-log", tmp_path / "seen", "--stop-at", "7"]
    _torchrun(script, *args)
    assert _seen(tmp_path)[1] == [7, 7]
    _torchrun(script, *args, "--resume")
    counts, steps = _seen(tmp_path)
    assert steps == [20, 20]
    assert sorted(counts) == list(range(160)) and set(counts.values()) == {1}
