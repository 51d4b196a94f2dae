"""A build with worker processes that one worker's error stops says why in the manifest it
leaves, as a build without workers does: verify names the record, not "killed"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ShardkitError
from shardkit.format.manifest.model import Manifest, incomplete_reason

pytestmark = pytest.mark.integration


def test_a_worker_error_is_named_in_the_manifest_left(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(3):
        lines = [json.dumps({"key": f"{i}-{j}", "t": "x" * 20}) for j in range(30)]
        if i == 1:
            lines.append("{oops")  # line 31 of b1.jsonl
        (raw / f"b{i}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(ShardkitError, match=r"b1\.jsonl line 31"):
        sk.build([str(raw)], str(out), workers=2, maxcount=10, key_field="key", progress=False)
    m = Manifest.load(out / "manifest.json")
    assert m.created["build"]["complete"] is False
    assert "b1.jsonl line 31" in m.created["build"]["stopped"]
    why = incomplete_reason(m)
    assert why is not None and "b1.jsonl line 31" in why and "killed" not in why
