"""Hostile: ``shardkit plan`` and ``bench`` numbers (issue 33 item 6's commands).

click's FloatRange lets NaN through (every comparison with it is False): ``plan
--step-time nan`` printed "needs nan tokens/s" with exit 0, ``--step-time inf`` "needs 0";
``--measured nan`` or ``-5`` was taken as a rate; ``--measured FILE`` of another kind was a
JSONDecodeError traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli

PLAN = ["plan", "--seq-len", "64", "--micro-batch", "2"]


@pytest.mark.parametrize(
    "args",
    [
        ["--step-time", "nan"],
        ["--step-time", "inf"],
        ["--step-time", "1", "--bytes-per-token", "nan"],
        ["--step-time", "1", "--measured", "nan"],
        ["--step-time", "1", "--measured", "-5"],
        ["--step-time", "1", "--measured", "inf"],
    ],
)
def test_plan_refuses_numbers_that_are_not(args: list[str]) -> None:
    res = CliRunner().invoke(cli, [*PLAN, *args])
    assert res.exit_code == 2, res.output
    assert "nan" not in res.output.split("Error:")[0]  # nothing computed from it


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"mb_per_s": "fast"}'])
def test_plan_names_a_measured_file_of_another_kind(tmp_path: Path, text: str) -> None:
    f = tmp_path / "bench.json"
    f.write_text(text)
    res = CliRunner().invoke(cli, [*PLAN, "--step-time", "1", "--measured", str(f)])
    assert res.exit_code == 2 and "--measured" in res.output, res.output


def test_bench_refuses_nan_seconds(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", str(tmp_path / "m.json"), "--seconds", "nan"])
    assert res.exit_code == 2 and "finite" in res.output
