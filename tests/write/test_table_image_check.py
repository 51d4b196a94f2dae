"""Parquet image cells are checked by a default build, as folder images are.

A truncated JPEG and text named ``.jpg`` in a Parquet image column (a Hub Image struct,
and a binary column named like an image) went into the shards and failed only in
training; ``shardkit build`` (``--check-images header`` by default) now stops naming the
file, row and column, and ``--on-error skip`` leaves them out, recorded in
``manifest.errors.jsonl``. ``--check-images off`` trusts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.data import tiny_image
from tests.helpers.readback import keys_of, read_samples, shardkit

pytestmark = pytest.mark.integration

_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
GOOD = tiny_image(3, "JPEG")
CUT = GOOD[: len(GOOD) // 2]
TEXT = b"this is not an image"


def _errors(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(params=["struct", "binary"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """Rows 1 and 4 good (counted from 1), row 2 a truncated JPEG, row 3 text named .jpg;
    the file and the column's name."""
    cells = [GOOD, CUT, TEXT, GOOD]
    ids = [f"doc{i}" for i in range(4)]
    if request.param == "struct":
        col, values = "image", pa.array([{"bytes": b, "path": "x.jpg"} for b in cells], _IMAGE)
    else:
        col, values = "photo.jpg", pa.array(cells, pa.binary())
    src = tmp_path / "images.parquet"
    pq.write_table(pa.table({col: values, "id": ids}), src)
    return src, col


@pytest.mark.timeout(120)
def test_a_default_build_refuses_a_bad_image_naming_file_row_and_column(
    table: tuple[Path, str], tmp_path: Path
) -> None:
    src, col = table
    r = shardkit("build", src, "-o", tmp_path / "a", "--key-field", "id")
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "images.parquet" in line and "row 2" in line and f"column {col!r}" in line, line
    assert "truncated" in line.lower(), line


@pytest.mark.timeout(120)
def test_on_error_skip_records_them_in_the_errors_file(
    table: tuple[Path, str], tmp_path: Path
) -> None:
    src, col = table
    out = tmp_path / "b"
    r = shardkit("build", src, "-o", out, "--key-field", "id", "--on-error", "skip", "--json")
    assert r.returncode == 0, r.stderr
    errors = _errors(out / "manifest.errors.jsonl")
    assert [(e["row"], Path(e["source"]).name) for e in errors] == [
        (2, "images.parquet"),
        (3, "images.parquet"),
    ], errors
    assert all(f"column {col!r}" in e["reason"] for e in errors), errors
    assert "truncated" in errors[0]["reason"].lower(), errors
    assert "not a readable jpg" in errors[1]["reason"], errors
    samples = read_samples(out / "manifest.json")
    assert keys_of(samples) == ["doc0", "doc3"]
    field = "image.jpg" if col == "image" else col
    assert all(s[field] == GOOD for s in samples)
    # off trusts them (the old behaviour, now a choice)
    r = shardkit("build", src, "-o", tmp_path / "c", "--check-images", "off", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 4, r.stderr
