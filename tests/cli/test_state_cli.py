"""``shardkit state show`` / ``state diff`` on real saved loader states (JSON and torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result

from shardkit import ShardDataset, WebLoader, mix
from shardkit.cli import cli
from shardkit.errors import StateDictError
from tests.helpers.data import make_shards

PIPELINE = """
from shardkit import ShardDataset, WebLoader, mix

def make_loader():
    sets = [ShardDataset({a!r}, seed=1).decode(), ShardDataset({c!r}, seed=1).decode()]
    return WebLoader(mix(sets, weights=[{w}, 1], names=["web", "code"]).batched({n}))
"""


def invoke(*argv: str) -> Result:
    return CliRunner().invoke(cli, list(argv), catch_exceptions=False)


def saved(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A torch checkpoint and a JSON file holding the state of a two-source mixture loader
    after 3 batches; the manifests' paths."""
    paths = {}
    for name in ("a", "b", "c"):
        make_shards(tmp_path / name, [6, 6], prefix=name)
        paths[name] = str(tmp_path / name / "manifest.json")
    sets = [ShardDataset(paths[k], seed=1).decode() for k in ("a", "b")]
    loader = WebLoader(mix(sets, weights=[1, 1], names=["web", "books"]).batched(2))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    pt = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "data": state}, pt)
    js = tmp_path / "state.json"
    js.write_text(json.dumps({"data": state}), encoding="utf-8")
    return pt, js, paths


def test_show_prints_epoch_world_sources_and_fingerprint(tmp_path: Path) -> None:
    pt, js, _ = saved(tmp_path)
    out = invoke("state", "show", str(pt))
    assert out.exit_code == 0, out.output
    assert "epoch 0 (in progress), 1 ranks x 1 workers" in out.output
    assert "web: epoch 0, read" in out.output and "books:" in out.output
    assert "mix  " in out.output and "n=2 partial=true" in out.output
    d: dict[str, Any] = json.loads(invoke("state", "show", str(js), "--json").output)
    assert d["world"] == 1 and d["batches"] == {"0": 3}
    got = d["sources"]
    assert got["web"]["samples"] + got["books"]["samples"] == 6
    assert got["web"]["read"] == got["web"]["samples"] and got["web"]["samples_total"] == 12
    with pytest.raises(StateDictError, match="no key 'model'"):  # main(): exit 1, one line
        invoke("state", "show", str(js), "--key", "model")


def test_diff_names_the_allow_values_a_load_needs(tmp_path: Path) -> None:
    pt, _, paths = saved(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(PIPELINE.format(a=paths["a"], c=paths["c"], w=3, n=4), encoding="utf-8")
    out = invoke("state", "diff", str(pt), "--pipeline", f"{script}:make_loader", "--json")
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["allow"] == ["batch_size", "sources", "weights"] and not d["refused"]
    assert any("removed ['books']" in c["what"] for c in d["changes"])
    text = invoke("state", "diff", str(pt), "--pipeline", f"{script}:make_loader")
    assert "batch_size: batched(2) -> batched(4)" in text.output
    assert "load with allow=" in text.output
    # the allow values it names do load the state
    ns: dict[str, Any] = {}
    exec(compile(script.read_text(), str(script), "exec"), ns)
    loader = ns["make_loader"]()
    loader.load_state_dict(torch.load(pt, weights_only=True)["data"], allow=set(d["allow"]))
    assert len(list(loader)) > 0


def test_diff_refuses_another_data_set_with_exit_1(tmp_path: Path) -> None:
    pt, _, paths = saved(tmp_path)
    script = tmp_path / "other.py"
    script.write_text(
        "from shardkit import ShardDataset\n"
        f"def make():\n    return ShardDataset({paths['c']!r}).batched(2)\n",
        encoding="utf-8",
    )
    out = invoke("state", "diff", str(pt), "--pipeline", f"{script}:make")
    assert out.exit_code == 1 and "refused:" in out.output


def test_show_says_no_exposure_without_a_mixture(tmp_path: Path) -> None:
    """A pipeline without a mixture has no exposure (it printed 'exposure 0 samples')."""
    make_shards(tmp_path / "a", [6, 6], prefix="a")
    loader = WebLoader(ShardDataset(str(tmp_path / "a" / "manifest.json")).batched(2))
    it = iter(loader)
    next(it)
    js = tmp_path / "plain.json"
    js.write_text(json.dumps(loader.state_dict()), encoding="utf-8")
    out = invoke("state", "show", str(js))
    assert out.exit_code == 0 and "shards: epoch 0, read" in out.output, out.output
    assert "; exposure" not in out.output
    d = json.loads(invoke("state", "show", str(js), "--json").output)
    assert "samples" not in d["sources"]["shards"] and d["sources"]["shards"]["read"] > 0
