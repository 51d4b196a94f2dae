"""Hostile places, inputs: a folder of records with a stray document beside them is read as
records, and the CLI says what it left out once (it printed each note twice: the note and
the same text as a logged warning through Python's last-resort handler); the folder a
build wrote, given to verify or inspect, is read as its manifest, or answered with where
its manifest should be (it was "Is a directory")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cli import main

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


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_the_output_folder_given_for_its_manifest_says_where_it_is(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with sk.ShardWriter(tmp_path / "out") as w:
        w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(SystemExit) as info:
        main([command, str(tmp_path / "out")])  # what `build -o` was given: its manifest
    assert info.value.code in (0, None), capsys.readouterr().err
    (tmp_path / "out" / "manifest.json").unlink()
    with pytest.raises(SystemExit) as info:
        main([command, str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code != 0
    assert str(tmp_path / "out" / "manifest.json") in err, err  # not "Is a directory"
