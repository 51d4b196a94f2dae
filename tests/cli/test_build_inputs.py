"""Bounded build inputs through the real CLI and the Python API: ``--part`` bounds,
record-size limits, nesting depth, Parquet batches and member-name collisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit.errors import ConfigError, WriterError
from shardkit.format.manifest.model import Manifest
from shardkit.write.build import build
from shardkit.write.build.plan import part_range, split_contiguous
from shardkit.write.inputs.sources import SourceError
from tests.helpers.data import tiny_image
from tests.helpers.hostile import run_cli_measured
from tests.helpers.readback import read_samples, shardkit, write_jsonl

pytestmark = pytest.mark.integration

_RSS_LIMIT = 400 << 20  # an interpreter with shardkit, click and numpy is ~60-120 MB


@pytest.mark.parametrize("count", ["99999999999999999999", "1000000000"])
def test_part_of_a_huge_count_costs_nothing(tmp_path: Path, count: str) -> None:
    """``--part 0/N`` for a huge N: no OverflowError, no N-sized list (it was 22 GB)."""
    src = write_jsonl(tmp_path / "a.jsonl", ({"i": i} for i in range(50)))
    out = tmp_path / "out"
    rc, err, peak = run_cli_measured("build", src, "-o", out, "--part", f"0/{count}")
    assert rc == 0, err
    assert peak < _RSS_LIMIT, peak
    m = Manifest.load(out / f"manifest.part-0000-of-{int(count):04d}.json")
    assert m.part == {"index": 0, "count": int(count)}
    rc, err, _ = run_cli_measured("build", src, "-o", out, "--part", f"{count}/{count}")
    assert rc == 2 and "0 <= I < N" in err, err
    rc, err, _ = run_cli_measured("build", src, "-o", out, "--part", "0/1" + "0" * 20)
    assert rc == 2 and "more than a manifest holds" in err, err


def test_part_range_is_split_contiguous_one_group(tmp_path: Path) -> None:
    sizes = [5, 1, 1, 30, 2, 2, 2, 9, 0, 4]
    for n in (1, 2, 3, 7, 10, 25):
        assert [part_range(sizes, n, i) for i in range(n)] == split_contiguous(sizes, n)
    assert [part_range([0, 0, 0], 2, i) for i in range(2)] == split_contiguous([0, 0, 0], 2)
    src = write_jsonl(tmp_path / "a.jsonl", ({"i": i} for i in range(10)))
    res = build([str(src)], tmp_path / "p", part=(3, 10**20 - 1), progress=False)
    assert res.manifest.total_samples == 0
    assert res.manifest.part == {"index": 3, "count": 10**20 - 1}
    with pytest.raises(ConfigError, match="more than a manifest holds"):
        build([str(src)], tmp_path / "q", part=(3, 10**20), progress=False)


def _parquet(path: Path, rows: int = 2000) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [f"row {i} " * 20 for i in range(rows)], "n": list(range(rows))})
    pq.write_table(table, path, row_group_size=500, compression="none")
    return path


@pytest.mark.parametrize("damage", ["truncated", "flipped", "junk"])
def test_a_damaged_parquet_exits_1_with_one_line(tmp_path: Path, damage: str) -> None:
    """A cut footer, corrupted pages, or no Parquet at all: exit 1 and one line naming the
    file (it was exit 2 with the usage text, or an error naming the output directory)."""
    good = _parquet(tmp_path / "good.parquet").read_bytes()
    if damage == "truncated":
        data = good[: len(good) // 2]
    elif damage == "flipped":
        mid = len(good) // 3
        data = good[:mid] + bytes(b ^ 0x55 for b in good[mid : mid + 3000]) + good[mid + 3000 :]
    else:
        data = b"PAR1" + b"x" * 100
    bad = tmp_path / "in" / "bad.parquet"
    bad.parent.mkdir()
    bad.write_bytes(data)
    for src in (bad, bad.parent):
        r = shardkit("build", src, "-o", tmp_path / f"out-{src.name}")
        assert r.returncode == 1, r.stdout + r.stderr
        line = r.stderr.strip()
        assert "\n" not in line and "Usage" not in line and "bad.parquet" in line, r.stderr
    with pytest.raises(WriterError, match=r"bad\.parquet.*cannot read"):
        build([str(bad)], tmp_path / "api", progress=False)


def _huge_line_zst(path: Path, size: int = 600 << 20) -> Path:
    """A ``.jsonl.zst`` of a good line, one ``size``-byte line, a good line (~19 KB)."""
    import zstandard

    with open(path, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as z:
        z.write(b'{"i": 0}\n{"t": "')
        block = b"a" * (8 << 20)
        for _ in range(size // len(block)):
            z.write(block)
        z.write(b'"}\n{"i": 2}\n')
    return path


def test_a_huge_line_is_a_bad_record_with_bounded_memory(tmp_path: Path) -> None:
    """A 600 MB line in a small .jsonl.zst reached 2.46 GB RSS; now the line is read
    through, never held: exit 1 naming file and line, or skipped and reported."""
    (tmp_path / "in").mkdir()
    src = _huge_line_zst(tmp_path / "in" / "big.jsonl.zst")
    assert src.stat().st_size < 100_000
    rc, err, peak = run_cli_measured("build", src, "-o", tmp_path / "raise")
    assert rc == 1, err
    assert "big.jsonl.zst line 2" in err and "more than the record limit" in err, err
    assert "\n" not in err.strip(), err
    assert peak < _RSS_LIMIT + (256 << 20), peak  # at most the default limit is held
    out = tmp_path / "skip"
    rc, err, peak = run_cli_measured(
        "build", src, "-o", out, "--on-error", "skip", "--max-record", "1MB"
    )
    assert rc == 0, err
    assert peak < _RSS_LIMIT, peak
    report = [json.loads(x) for x in (out / "manifest.errors.jsonl").read_text().splitlines()]
    assert [
        (r["line"], "more than the record limit of 1000000" in r["reason"]) for r in report
    ] == [(2, True)]
    assert [s["json"] for s in read_samples(out / "manifest.json")] == [b'{"i": 0}', b'{"i": 2}']


def test_deep_nesting_is_a_named_skippable_error(tmp_path: Path) -> None:
    depth = 100_000
    src = tmp_path / "deep.jsonl"
    src.write_text('{"i": 0}\n' + "[" * depth + "]" * depth + '\n{"i": 2}\n')
    raised = shardkit("build", src, "-o", tmp_path / "a")
    assert raised.returncode == 1 and "RecursionError" not in raised.stderr, raised.stderr
    assert "deep.jsonl line 2: JSON nested too deeply" in raised.stderr, raised.stderr
    res = build([str(src)], tmp_path / "b", on_error="skip", progress=False)
    assert res.manifest.total_samples == 2
    report = (tmp_path / "b" / "manifest.errors.jsonl").read_text()
    assert '"line": 2' in report and "nested too deeply" in report


def _dict_parquet(path: Path, rows: int, value: str) -> Path:
    """``rows`` rows of one dictionary-encoded string: a file of a few hundred bytes (made
    without ever holding ``rows`` copies, so the measured child inherits no large RSS)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    col = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))
    pq.write_table(pa.table({"text": col}), path, compression="zstd")
    return path


def test_parquet_is_read_in_batches_bounded_by_bytes(tmp_path: Path) -> None:
    """1,500 rows of one dictionary-encoded 1 MB string (a 523-byte file) took 1.13 GB,
    growing with rows x row size; now rows are built 64 MB at a time and a row over
    --max-record is a bad record found from the dictionary, never built."""
    big = "x" * (1 << 20)
    src = _dict_parquet(tmp_path / "dict.parquet", 1500, big)
    assert src.stat().st_size < 10_000
    skip = tmp_path / "skip"
    args = ("--max-record", "512KB", "--on-error", "skip")
    rc, err, peak = run_cli_measured("build", src, "-o", skip, *args)
    assert rc == 1 and "every record was skipped (1500)" in err, err  # no empty "OK" set
    assert peak < _RSS_LIMIT, peak
    m = Manifest.load(skip / "manifest.json")
    assert m.total_samples == 0 and m.created["build"]["skipped_records"] == 1500
    assert m.created["build"]["complete"] is False
    rc, err, _ = run_cli_measured("build", src, "-o", tmp_path / "raise", "--max-record", "512KB")
    assert rc == 1 and "row 1 holds 1048576 bytes, more than the record limit" in err, err

    some = _dict_parquet(tmp_path / "some.parquet", 200, big)
    rc, err, peak = run_cli_measured("build", some, "-o", tmp_path / "ok", "--maxsize", "64MB")
    assert rc == 0, err
    assert peak < _RSS_LIMIT, peak
    samples = read_samples(tmp_path / "ok" / "manifest.json")
    assert len(samples) == 200 and json.loads(samples[-1]["json"]) == {"text": big}
    with pytest.raises(SourceError, match=r"every record was skipped \(1500\)"):  # the API too
        build([str(src)], tmp_path / "api", max_record="512KB", on_error="skip", progress=False)
    api = Manifest.load(tmp_path / "api" / "manifest.json")
    assert api.created["build"]["skipped_records"] == 1500


@pytest.mark.parametrize(
    ("columns", "member"),
    [
        ({"json": [b"raw"], "text": ["t"]}, "json"),  # binary 'json' vs the other columns
        (
            {
                "image": [{"bytes": tiny_image(1, "JPEG"), "path": "a.jpg"}],
                "image.jpg": [tiny_image(2, "JPEG")],
            },
            "image.jpg",
        ),
    ],
)
def test_parquet_member_name_collisions_are_refused(
    tmp_path: Path, columns: dict[str, list[object]], member: str
) -> None:
    """Two columns naming one member: one value was silently dropped, exit 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "clash.parquet"
    pq.write_table(pa.table(columns), src)
    r = shardkit("build", src, "-o", tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "clash.parquet" in line and "row 1" in line, line
    assert f"member {member!r} comes from both" in line, line
    with pytest.raises(WriterError, match=f"member {member!r} comes from both"):
        build([str(src)], tmp_path / "api", progress=False)
