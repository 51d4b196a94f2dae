"""Hostile places, inputs: a folder of records with a stray document beside them is read as
records, and the CLI says what it left out once (it printed each note twice: the note and
the same text as a logged warning through Python's last-resort handler)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_left_out_document_is_said_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(3)))
    (src / "README.md").write_text("# a dataset card\n")
    run = subprocess.run(
        [sys.executable, "-c", "from shardkit.cli import main; main()", "build", str(src),
         "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("README.md") == 1, run.stderr
    assert "3 samples" in run.stdout
