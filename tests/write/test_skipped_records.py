"""Every record a build leaves out is named in ``manifest.errors.jsonl``: samples without
a required field, bad lines of each part after a merge; a shard set inside an input tree
is left out with a note instead of being packed as samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit.format.manifest.model import Manifest
from shardkit.write.build import build, merge_parts
from shardkit.write.inputs.select import TreeOptions
from tests.helpers.data import make_shards
from tests.helpers.readback import assert_whole, keys_of, read_samples, shardkit

pytestmark = pytest.mark.integration


def _tree(root: Path, n: int = 12) -> Path:
    """``n`` samples ``s00..``: every third lacks its json."""
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"s{i:02d}.txt").write_text(f"text {i}")
        if i % 3:
            (root / f"s{i:02d}.json").write_text(json.dumps({"i": i}))
    return root


def _report(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_require_fields_skip_names_each_left_out_sample(tmp_path: Path, workers: str) -> None:
    src = _tree(tmp_path / "raw")
    out = tmp_path / "out"
    args = ["--require-fields", "txt,json", "--on-error", "skip", "--workers", workers]
    r = shardkit("build", src, "-o", out, *args)
    assert r.returncode == 0, r.stderr
    assert "skipped 4 bad records" in r.stdout and "manifest.errors.jsonl" in r.stdout
    report = _report(out / "manifest.errors.jsonl")
    assert [e["sample"] for e in report] == ["s00", "s03", "s06", "s09"]
    assert all("lacks a required field (txt, json)" in str(e["reason"]) for e in report)
    m = assert_whole(out / "manifest.json")
    assert m.total_samples == 8 and m.created["build"]["skipped_records"] == 4
    assert keys_of(read_samples(m)) == [f"s{i:02d}" for i in range(12) if i % 3]
    api = build(
        [str(src)],
        tmp_path / "api",
        tree=TreeOptions(require=(("txt",), ("json",))),
        on_error="skip",
        workers=int(workers),
        progress=False,
    )
    assert api.manifest.created["build"]["skipped_records"] == 4
    assert _report(tmp_path / "api" / "manifest.errors.jsonl") == report


def test_merge_carries_the_parts_error_reports_and_counts(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for f in range(2):
        lines = [json.dumps({"f": f, "i": i}) for i in range(20)]
        lines[5 + f] = "{not json"
        (raw / f"f{f}.jsonl").parent.mkdir(exist_ok=True)
        (raw / f"f{f}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    for i in range(2):
        r = shardkit("build", raw, "-o", out, "--part", f"{i}/2", "--on-error", "skip")
        assert r.returncode == 0, r.stderr
    parts = sorted(str(p) for p in out.glob("manifest.part-*.json"))
    r = shardkit("manifest", "merge", *parts, "-o", out / "manifest.json")
    assert r.returncode == 0, r.stderr
    assert "the parts skipped 2 bad records" in r.stdout
    m = Manifest.load(out / "manifest.json")
    assert m.total_samples == 38 and m.created["build"]["skipped_records"] == 2
    report = _report(out / "manifest.errors.jsonl")
    assert [(Path(str(e["source"])).name, e["line"]) for e in report] == [
        ("f0.jsonl", 6),
        ("f1.jsonl", 7),
    ]
    inspect = shardkit("inspect", out / "manifest.json")
    assert "skipped 2 bad records" in inspect.stdout, inspect.stdout
    again = merge_parts(parts, tmp_path / "out" / "again.json")
    assert again.created["build"]["skipped_records"] == 2
    assert _report(out / "again.errors.jsonl") == report


def test_a_shard_set_inside_an_input_tree_is_left_out_with_a_note(tmp_path: Path) -> None:
    src = _tree(tmp_path / "raw", n=6)
    make_shards(src / "old_shards", [10, 10, 10])  # a manifest + 3 shards
    r = shardkit("build", src, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "left out" in r.stderr and "old_shards: a shard set" in r.stderr, r.stderr
    m = assert_whole(tmp_path / "out" / "manifest.json")
    assert keys_of(read_samples(m)) == [f"s{i:02d}" for i in range(6)]
    res = build([str(src)], tmp_path / "api", progress=False)
    assert res.manifest.total_samples == 6
    # given as a source of its own, the shard set is re-sharded
    whole = build([str(src / "old_shards")], tmp_path / "re", progress=False)
    assert whole.manifest.total_samples == 30


def test_a_manifest_is_a_reshard_source(tmp_path: Path) -> None:
    """``shardkit build old/manifest.json -o new/`` re-shards the set it lists."""
    old = make_shards(tmp_path / "old", [10, 10, 10])
    src = tmp_path / "old" / "manifest.json"
    r = shardkit("build", src, "-o", tmp_path / "new", "--maxcount", "7")
    assert r.returncode == 0, r.stderr
    new = assert_whole(tmp_path / "new" / "manifest.json")
    assert [s.nsamples for s in new.shards] == [7, 7, 7, 7, 2]
    assert read_samples(new) == read_samples(old)
    res = build([str(src)], tmp_path / "api", maxcount=15, progress=False)
    assert read_samples(res.manifest) == read_samples(old)
    m = Manifest.load(src)
    m.created["build"] = {"complete": False, "stopped": "killed"}
    half = tmp_path / "half.json"
    m.base = str(tmp_path / "old")
    half.write_text(m.dumps())
    bad = shardkit("build", half, "-o", tmp_path / "x")
    assert bad.returncode == 2 and "cannot re-shard it" in bad.stderr, bad.stderr


def _jpeg() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 20, 30)).save(buf, format="JPEG")
    return buf.getvalue()


def test_build_checks_image_fields_of_folders_and_tables(tmp_path: Path) -> None:
    """A truncated JPEG and text named .jpg went into the shards and failed only in
    training; a build checks image fields (header and end marker by default)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = _jpeg()
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "ok.jpg").write_bytes(good)
    (raw / "cut.jpg").write_bytes(good[: len(good) // 2])
    (raw / "text.jpg").write_text("this is not an image")
    r = shardkit("build", raw, "-o", tmp_path / "a")
    assert r.returncode == 1 and "cut.jpg" in r.stderr, r.stderr
    assert "truncated" in r.stderr.lower(), r.stderr
    r = shardkit("build", raw, "-o", tmp_path / "b", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    report = _report(tmp_path / "b" / "manifest.errors.jsonl")
    assert sorted(str(e["sample"]) for e in report) == ["cut", "text"]
    assert keys_of(read_samples(tmp_path / "b" / "manifest.json")) == ["ok"]
    off = build([str(raw)], tmp_path / "c", check_images="off", progress=False)
    assert off.manifest.total_samples == 3

    table = pa.table(
        {"image": [{"bytes": b, "path": "x.jpg"} for b in (good, good[:200], b"text")]}
    )
    src = tmp_path / "t.parquet"
    pq.write_table(table, src)
    r = shardkit("build", src, "-o", tmp_path / "d", "--check-images", "decode")
    assert r.returncode == 1 and "row 2" in r.stderr and "column 'image'" in r.stderr, r.stderr
    res = build([str(src)], tmp_path / "e", on_error="skip", check_images="decode", progress=False)
    assert res.manifest.total_samples == 1
    assert [e["row"] for e in _report(tmp_path / "e" / "manifest.errors.jsonl")] == [2, 3]
