"""The build library in one process: sources, splits, build from each source kind, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from shardkit.check.scan import scan_shard
from shardkit.check.summary import manifest_from_shards, summarize_manifest
from shardkit.errors import ConfigError, ManifestError
from shardkit.format.codecs import decode_field
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import read_index
from shardkit.write.build import BuildConfig, build, merge_parts, plan_build, split_contiguous
from shardkit.write.inputs.discover import discover
from shardkit.write.inputs.records import read_units
from shardkit.write.inputs.sources import SourceError, SourceOptions, parse_field_spec
from tests.helpers.data import make_shards
from tests.helpers.readback import assert_whole, keys_of, read_samples, write_jsonl

# -- splitting -----------------------------------------------------------------------------


@given(st.lists(st.integers(0, 1000), max_size=60), st.integers(1, 9))
def test_split_contiguous_covers_everything_in_order(sizes: list[int], n: int) -> None:
    groups = split_contiguous(sizes, n)
    assert len(groups) == n
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert split_contiguous(sizes, n) == groups
    total = sum(sizes)
    if total:
        # a group holds at most its share plus one item that straddles a boundary
        for g in groups:
            assert sum(sizes[i] for i in g) <= total / n + max(sizes) + 1e-9


def test_split_contiguous_balances_equal_items() -> None:
    assert [len(g) for g in split_contiguous([10] * 10, 2)] == [5, 5]
    assert [len(g) for g in split_contiguous([0] * 4, 2)] == [2, 2]
    with pytest.raises(ConfigError):
        split_contiguous([1], 0)


# -- sources -------------------------------------------------------------------------------


def test_parse_field_spec() -> None:
    fm = parse_field_spec("tokens=npy:int32")
    assert (fm.name, fm.field, fm.dtype) == ("tokens", "tokens.npy", "int32")
    assert parse_field_spec("text=txt").field == "text.txt"
    for bad in ("text", "=txt", "text=", "text=txt:int32", "t=npy:notadtype", "t=.x"):
        with pytest.raises(ConfigError):
            parse_field_spec(bad)


def _tree(root: Path) -> None:
    files = {
        "b/x.json": b'{"b": 1}',
        "a/z.txt": b"zz",
        "a/y.cls": b"3",
        "a/y.txt": b"yy",
        "a.d/q.json": b"{}",
        "a.json": b'{"top": 1}',
        "a.b.txt": b"ab",
        "README": b"no extension: skipped",
        ".hidden.txt": b"hidden: skipped",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def test_discover_groups_a_file_tree_by_key(tmp_path: Path) -> None:
    _tree(tmp_path / "raw")
    units = discover([str(tmp_path / "raw")])
    assert [u.kind for u in units] == ["files"] * 5
    assert [u.name for u in units] == ["a", "a.d/q", "a/y", "a/z", "b/x"]
    assert [tuple(f for f, _ in u.members) for u in units] == [
        ("b.txt", "json"),
        ("json",),
        ("cls", "txt"),
        ("txt",),
        ("json",),
    ]
    samples = [s for s, _ in read_units(units) if s is not None]
    assert samples[0] == {"__key__": "a", "b.txt": b"ab", "json": b'{"top": 1}'}
    assert samples[2] == {"__key__": "a/y", "cls": b"3", "txt": b"yy"}


def test_discover_detects_jsonl_and_tar_directories(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "j" / "one.jsonl", [{"a": 1}])
    write_jsonl(tmp_path / "j" / "sub" / "two.jsonl", [{"a": 2}])
    assert [(u.kind, u.name) for u in discover([str(tmp_path / "j")])] == [
        ("jsonl", "one"),
        ("jsonl", "sub/two"),
    ]
    make_shards(tmp_path / "t", [2, 3])
    units = discover([str(tmp_path / "t")])
    assert [(u.kind, u.name) for u in units] == [("tar", "data-000000"), ("tar", "data-000001")]
    pattern = str(tmp_path / "t" / "data-{000000..000001}.tar")
    assert [u.path for u in discover([pattern])] == [u.path for u in units]


def test_discover_refuses_missing_duplicate_and_unknown_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        discover([str(tmp_path / "nope")])
    f = write_jsonl(tmp_path / "a" / "x.jsonl", [{"a": 1}])
    g = write_jsonl(tmp_path / "b" / "x.jsonl", [{"a": 1}])
    with pytest.raises(ConfigError, match="given twice"):
        discover([str(f), str(f)])
    with pytest.raises(ConfigError, match="key prefix 'x'"):
        discover([str(f), str(g)])
    (tmp_path / "data.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="cannot tell"):
        discover([str(tmp_path / "data.bin")])
    with pytest.raises(ConfigError, match="matches nothing"):
        discover([str(tmp_path / "*.parquet")])


def test_jsonl_records_map_to_fields(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"id": "d1", "text": "hello", "tokens": [1, 2, 3]},
            {"id": "d2", "text": "", "tokens": []},
        ],
    )
    opts = SourceOptions(
        (parse_field_spec("text=txt"), parse_field_spec("tokens=npy:int32")), key_field="id"
    )
    got = [s for s, _ in read_units(discover([str(path)]), opts) if s is not None]
    assert keys_of(got) == ["d1", "d2"]
    assert got[0]["text.txt"] == b"hello"
    tokens = decode_field("d1", "tokens.npy", got[0]["tokens.npy"])
    assert tokens.dtype == np.int32 and tokens.tolist() == [1, 2, 3]
    assert json.loads(got[0]["json"]) == {"id": "d1"}
    assert decode_field("d2", "tokens.npy", got[1]["tokens.npy"]).shape == (0,)


def test_jsonl_default_keeps_the_line_bytes_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b'{"b": 2,  "a": 1}\n\n  \n{"c": [1, 2]}\r\n')
    items = list(read_units(discover([str(path)])))
    samples = [s for s, _ in items if s is not None]
    assert samples == [
        {"__key__": "raw/000000001", "json": b'{"b": 2,  "a": 1}'},
        {"__key__": "raw/000000004", "json": b'{"c": [1, 2]}'},
    ]
    assert sum(n for _, n in items) == path.stat().st_size


def test_jsonl_zst_reads_like_plain(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "p" / "a.jsonl", [{"i": i} for i in range(50)])
    (tmp_path / "z").mkdir()
    packed = tmp_path / "z" / "a.jsonl.zst"
    packed.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    one = [s for s, _ in read_units(discover([str(plain)])) if s is not None]
    two = [s for s, _ in read_units(discover([str(packed)])) if s is not None]
    assert one == two and len(one) == 50


@pytest.mark.parametrize(
    ("line", "opts", "message"),
    [
        (b'{"a": 1', SourceOptions(), "not valid JSON"),
        (b"[1, 2]", SourceOptions(key_field="id"), "expected a JSON object"),
        (b'{"x": 1}', SourceOptions(key_field="id"), "key field 'id'"),
        (b'{"id": "a.b"}', SourceOptions(key_field="id"), "'.' in its last part"),
        (b'{"id": "k"}', SourceOptions((parse_field_spec("text=txt"),)), "no field 'text'"),
        (b'{"text": 5}', SourceOptions((parse_field_spec("text=txt"),)), "cannot encode"),
        (b'{"t": "\xff"}', SourceOptions(), "UTF-8"),
    ],
)
def test_bad_jsonl_lines_name_file_and_line(
    tmp_path: Path, line: bytes, opts: SourceOptions, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "ok", "text": "fine"}\n\n' + line + b"\n")
    with pytest.raises(SourceError, match=message) as info:
        list(read_units(discover([str(path)]), opts))
    assert info.value.line == 3 and info.value.path == str(path)
    assert f"{path} line 3" in str(info.value)


def test_skip_drops_the_first_samples_without_decoding(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"i": i} for i in range(10)])
    with open(path, "ab") as f:  # a malformed tail is not reached by a skip
        f.write(b"\n")
    got = [s for s, _ in read_units(discover([str(path)]), skip=7) if s is not None]
    assert [json.loads(s["json"])["i"] for s in got] == [7, 8, 9]


# -- building ------------------------------------------------------------------------------


def _records(n: int, start: int = 0) -> list[dict[str, object]]:
    rng = np.random.default_rng(start)
    return [
        {"id": f"doc{i:05d}", "text": "w " * int(rng.integers(0, 300)), "n": i}
        for i in range(start, start + n)
    ]


def test_build_jsonl_reads_back_exactly(tmp_path: Path) -> None:
    recs = _records(300)
    src = write_jsonl(tmp_path / "in" / "a.jsonl", recs[:200])
    write_jsonl(tmp_path / "in" / "b.jsonl", recs[200:])
    res = build([str(src.parent)], tmp_path / "out", maxsize="64KB")
    assert res.samples == 300 and res.resumed_samples == 0
    assert len(res.manifest) > 3
    assert_whole(res.manifest_path)
    back = read_samples(res.manifest_path)
    assert [json.loads(s["json"]) for s in back] == recs
    assert keys_of(back)[:2] == ["a/000000001", "a/000000002"]
    assert keys_of(back)[200] == "b/000000001"
    assert res.manifest.fields["json"]["count"] == 300
    assert res.manifest.created["build"]["complete"] is True


def test_build_file_tree_reads_back_exactly(tmp_path: Path) -> None:
    _tree(tmp_path / "raw")
    res = build([str(tmp_path / "raw")], tmp_path / "out", maxcount=2, checksum="xxh3_128")
    assert [s.nsamples for s in res.manifest.shards] == [2, 2, 1]
    assert_whole(res.manifest_path)
    back = read_samples(res.manifest_path)
    assert keys_of(back) == ["a", "a.d/q", "a/y", "a/z", "b/x"]
    assert back[2] == {"__key__": "a/y", "cls": b"3", "txt": b"yy"}


def test_build_reshards_small_shards_into_big_ones(tmp_path: Path) -> None:
    small = make_shards(tmp_path / "small", [7, 3, 9, 1, 5])
    res = build(
        [str(tmp_path / "small" / "data-{000000..000004}.tar")],
        tmp_path / "big",
        maxcount=10,
        compress="zstd",
    )
    assert [s.nsamples for s in res.manifest.shards] == [10, 10, 5]
    assert all(s.url.endswith(".tar.zst") for s in res.manifest.shards)
    assert_whole(res.manifest_path)
    assert read_samples(res.manifest_path) == read_samples(
        os.path.join(small.base or "", "manifest.json")
    )


def test_build_refuses_an_existing_build_without_resume(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", _records(20))
    first = build([str(src)], tmp_path / "out")
    assert not first.nothing_to_do
    same = build([str(src)], tmp_path / "out")  # a finished build of these inputs
    assert same.nothing_to_do and (same.samples, same.resumed_samples) == (0, 20)
    assert same.manifest.to_dict() == first.manifest.to_dict()
    assert plan_build([str(src)], tmp_path / "out").done is not None
    again = build([str(src)], tmp_path / "out", resume=True)
    assert (again.samples, again.resumed_samples) == (0, 20)
    with pytest.raises(ConfigError, match=r"other inputs or options.*maxcount None -> 3"):
        plan_build([str(src)], tmp_path / "out", BuildConfig(resume=True, maxcount=3))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no input"):
        plan_build([str(tmp_path / "empty")], tmp_path / "x")


def test_resume_after_a_failed_build_finishes_it(tmp_path: Path) -> None:
    """A bad line stops the build; fixed in place, ``resume`` writes only what is missing."""
    good = b"".join(json.dumps(r).encode() + b"\n" for r in _records(400))
    lines = good.splitlines(keepends=True)
    broken_at = 300
    bad = lines[broken_at][:-2] + b"!\n"  # same length, no longer JSON
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join([*lines[:broken_at], bad, *lines[broken_at + 1 :]]))
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=f"line {broken_at + 1}"):
        build([str(src)], out, maxsize="48KB")
    partial = assert_whole(out / "manifest.json")
    assert 0 < partial.total_samples < broken_at
    assert not [p for p in os.listdir(out) if ".tmp-" in p]
    src.write_bytes(good)
    res = build([str(src)], out, maxsize="48KB", resume=True)
    assert res.resumed_samples == partial.total_samples
    assert res.samples == 400 - partial.total_samples
    fresh = build([str(src)], tmp_path / "fresh", maxsize="48KB")
    assert read_samples(res.manifest_path) == read_samples(fresh.manifest_path)
    assert [s.checksum for s in res.manifest] == [s.checksum for s in fresh.manifest]
    assert res.manifest.fields == fresh.manifest.fields


def test_parts_cover_every_sample_once_and_merge(tmp_path: Path) -> None:
    srcs = [write_jsonl(tmp_path / "in" / f"f{i}.jsonl", _records(30, 30 * i)) for i in range(5)]
    out = tmp_path / "out"
    parts = [build([str(tmp_path / "in")], out, part=(i, 2), maxcount=25) for i in range(2)]
    names = sorted(os.listdir(out))
    assert "manifest.part-0000-of-0002.json" in names
    assert any(n.startswith("data-p0001-000000") for n in names)
    with pytest.raises(ManifestError, match="part 1 missing"):
        merge_parts([parts[0].manifest_path], out / "manifest.json")
    merged = merge_parts([p.manifest_path for p in reversed(parts)], out / "manifest.json")
    assert merged.total_samples == 150 and merged.part is None
    schema = json.loads(
        (Path(__file__).parents[2] / "manifests" / "manifest.schema.json").read_text()
    )
    for doc in (out / "manifest.json", Path(parts[1].manifest_path)):
        jsonschema.validate(json.loads(doc.read_text()), schema)
    got = sorted(keys_of(read_samples(out / "manifest.json")))
    assert got == sorted(f"f{i}/{j:09d}" for i in range(len(srcs)) for j in range(1, 31))
    assert_whole(out / "manifest.json")


# -- scanning foreign shards ---------------------------------------------------------------


def test_scan_and_from_shards_agree_with_the_writer(tmp_path: Path) -> None:
    m = make_shards(tmp_path / "s", [4, 6])
    base = m.base or ""
    for s in m.shards:
        scan = scan_shard(os.path.join(base, s.url))
        assert (scan.size, scan.checksum, scan.nsamples) == (s.size, s.checksum, s.nsamples)
        with open(os.path.join(base, s.index or ""), "rb") as f:
            offsets = read_index(f.read())
        assert [*scan.offsets, scan.end] == offsets.tolist()
    os.remove(os.path.join(base, "manifest.json"))
    made, path = manifest_from_shards(base, algo="sha256")
    assert path == os.path.join(base, "manifest.json")
    assert [(s.url, s.size, s.nsamples, s.checksum) for s in made] == [
        (s.url, s.size, s.nsamples, s.checksum) for s in m
    ]
    assert made.fields == m.fields


def test_summary_flags_shards_outside_the_good_range(tmp_path: Path) -> None:
    m = make_shards(tmp_path / "s", [3, 1])
    d = summarize_manifest(m, keys=["k"])
    assert d["samples"] == 4 and d["shards"] == 2
    assert [s["last"] for s in d["outside_good_range"]] == [False, True]
    assert d["shard_samples"] == {"min": 1, "median": 2, "max": 3}
    assert d["fields"]["json"]["count"] == 4


def test_scan_of_a_bad_zstd_shard_is_a_format_error(tmp_path: Path) -> None:
    from shardkit.errors import ShardFormatError

    p = tmp_path / "bad.tar.zst"
    p.write_bytes(zstandard.ZstdCompressor().compress(b"x" * 4096)[:-3] + b"\0\0\0")
    with pytest.raises(ShardFormatError, match=str(p)):
        scan_shard(str(p))


def test_manifest_loads_the_build_block(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", _records(5))
    res = build([str(src)], tmp_path / "o")
    again = Manifest.load(res.manifest_path)
    assert again.created["build"]["config"] == res.manifest.created["build"]["config"]
