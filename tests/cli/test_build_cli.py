"""``shardkit build``, ``inspect`` and ``demo`` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardkit.cli import main
from shardkit.format.codecs import decode_field
from shardkit.format.manifest.model import Manifest
from tests.helpers.data import make_shards
from tests.helpers.readback import (
    assert_whole,
    hidden_leftovers,
    keys_of,
    read_samples,
    shard_digests,
    shardkit,
    write_jsonl,
)

pytestmark = pytest.mark.integration


def _corpus(root: Path, files: int = 5, per_file: int = 120) -> Path:
    """JSONL files of uneven sizes: text and a token list per record."""
    rng = np.random.default_rng(7)
    for f in range(files):
        n = per_file * (f + 1) // 2
        write_jsonl(
            root / f"shard{f}.jsonl",
            (
                {
                    "id": f"f{f}-{i:05d}",
                    "text": " ".join(["tok"] * int(rng.integers(1, 200))),
                    "tokens": rng.integers(0, 50_000, size=int(rng.integers(1, 300))).tolist(),
                }
                for i in range(n)
            ),
        )
    return root


def _multiset(samples: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple(sorted((k, bytes(v) if k != "__key__" else v) for k, v in s.items())) for s in samples
    )


def test_workers_give_the_same_samples_and_reproducible_shards(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "raw")
    common = ["--maxsize", "96KB", "--field", "text=txt", "--field", "tokens=npy:int32"]
    one = shardkit("build", src, "-o", tmp_path / "w1", *common, "--json")
    assert one.returncode == 0, one.stderr
    summary = json.loads(one.stdout)
    assert summary["workers"] == 1 and summary["samples"] == 900
    runs = []
    for name in ("w2a", "w2b"):
        r = shardkit("build", src, "-o", tmp_path / name, *common, "--workers", "2", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["workers"] == 2
        runs.append(tmp_path / name / "manifest.json")
    a, b = runs
    assert shard_digests(a) == shard_digests(b)  # byte-identical shards run to run
    assert not hidden_leftovers(tmp_path / "w2a")  # no work directory or temp file left
    base = read_samples(tmp_path / "w1" / "manifest.json")
    two = read_samples(a)
    assert len(base) == 900 and _multiset(two) == _multiset(base)
    assert_whole(a)
    m = Manifest.load(a)
    assert [s.url for s in m] == [f"data-{i:06d}.tar" for i in range(len(m))]
    assert m.fields == Manifest.load(tmp_path / "w1" / "manifest.json").fields
    tokens = decode_field("k", "tokens.npy", two[0]["tokens.npy"])
    assert tokens.dtype == np.int32
    verify = shardkit("verify", a, "--deep")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_parts_build_disjoint_halves_that_merge_into_the_whole(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "raw", files=6, per_file=60)
    out = tmp_path / "out"
    for i, extra in ((0, []), (1, ["--workers", "2"])):
        r = shardkit("build", src, "-o", out, "--part", f"{i}/2", "--maxcount", "40", *extra)
        assert r.returncode == 0, r.stderr
    parts = sorted(out.glob("manifest.part-*-of-0002.json"))
    assert [p.name for p in parts] == [
        "manifest.part-0000-of-0002.json",
        "manifest.part-0001-of-0002.json",
    ]
    halves = [keys_of(read_samples(p)) for p in parts]
    assert halves[0] and halves[1] and not set(halves[0]) & set(halves[1])
    merged = shardkit("manifest", "merge", *parts, "-o", out / "manifest.json", "--json")
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["samples"] == 630
    whole = shardkit("build", src, "-o", tmp_path / "whole", "--maxcount", "40")
    assert whole.returncode == 0, whole.stderr
    assert sorted(keys_of(read_samples(out / "manifest.json"))) == sorted(
        keys_of(read_samples(tmp_path / "whole" / "manifest.json"))
    )
    verify = shardkit("verify", out / "manifest.json", "--deep")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_reshard_a_brace_pattern_with_zstd(tmp_path: Path) -> None:
    make_shards(tmp_path / "small", [5, 5, 5, 5])
    pattern = tmp_path / "small" / "data-{000000..000003}.tar"
    r = shardkit(
        "build", pattern, "-o", tmp_path / "big", "--compress", "zstd", "--checksum", "xxh3_128"
    )
    assert r.returncode == 0, r.stderr
    m = assert_whole(tmp_path / "big" / "manifest.json")
    assert len(m) == 1 and m.shards[0].url == "data-000000.tar.zst"
    assert read_samples(tmp_path / "big" / "manifest.json") == read_samples(
        tmp_path / "small" / "manifest.json"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "SRC"], "Missing option '-o'"),
        (["build", "SRC", "-o", "OUT", "--part", "2/2"], "0 <= I < N"),
        (["build", "SRC", "-o", "OUT", "--part", "x"], "want I/N"),
        (["build", "SRC", "-o", "OUT", "--field", "text"], "NAME=EXT"),
        (["build", "SRC", "-o", "OUT", "--maxsize", "lots"], "not a size"),
        (["build", "SRC", "-o", "OUT", "--maxsize", "1KB"], "too small"),
        (["build", "NOPE", "-o", "OUT"], "does not exist"),
        (["build", "SRC", "-o", "DONE"], "does not record how it was built): pass --overwrite"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", [{"a": 1}])
    done = tmp_path / "done"
    done.mkdir()
    (done / "manifest.json").write_text(Manifest().dumps())
    subs = {
        "SRC": str(src),
        "OUT": str(tmp_path / "out"),
        "NOPE": str(tmp_path / "nope"),
        "DONE": str(done),
    }
    with pytest.raises(SystemExit) as info:  # the real entry point, in this process
        main([subs.get(a, a) for a in args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bad_input_exits_1_naming_file_and_line(tmp_path: Path, workers: str) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", [{"i": i} for i in range(50)])
    bad = raw / "b.jsonl"
    bad.write_text('{"i": 1}\n{"i": 2}\n{"i": oops}\n')
    r = shardkit("build", raw, "-o", tmp_path / "out", "--workers", workers)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"{bad} line 3: not valid JSON" in lines[0]


def test_inspect_a_manifest_and_a_shard(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "docs.jsonl", [{"t": "x" * i} for i in range(40)])
    assert shardkit("build", src, "-o", tmp_path / "out", "--maxcount", "15").returncode == 0
    text = shardkit("inspect", tmp_path / "out" / "manifest.json")
    assert text.returncode == 0, text.stderr
    assert "3 shards, 40 samples" in text.stdout
    assert "first keys: docs/000000001, docs/000000002" in text.stdout
    assert "note: a small set" in text.stdout and "json" in text.stdout
    d = json.loads(shardkit("inspect", tmp_path / "out" / "manifest.json", "--json").stdout)
    assert d["shard_samples"] == {"min": 10, "median": 15, "max": 15}
    assert d["fields"]["json"]["count"] == 40 and d["indexed_shards"] == 3
    shard = json.loads(shardkit("inspect", tmp_path / "out" / "data-000002.tar", "--json").stdout)
    assert shard["samples"] == 10 and shard["first_keys"][0] == "docs/000000031"
    assert shard["checksum"] == Manifest.load(tmp_path / "out" / "manifest.json").shards[2].checksum
    missing = shardkit("inspect", tmp_path / "nothing.json")
    assert missing.returncode == 1 and "nothing.json" in missing.stderr


def test_demo_builds_and_verifies(tmp_path: Path) -> None:
    r = shardkit("demo", "--samples", "300", "--out", tmp_path / "demo", "--maxsize", "256KB")
    assert r.returncode == 0, r.stderr
    assert "generated 300 documents" in r.stdout
    assert "samples/s" in r.stdout and "MB/s" in r.stdout and ": OK" in r.stdout
    m = assert_whole(tmp_path / "demo" / "shards" / "manifest.json")
    assert m.total_samples == 300 and len(m) > 1
    assert set(m.fields) == {"json", "text.txt", "tokens.npy"}
    d = json.loads(shardkit("demo", "--samples", "50", "--format", "files", "--json").stdout)
    assert d["verify"]["ok"] and d["build"]["samples"] == 50


def test_max_member_limits_what_a_build_and_a_bench_hold(tmp_path: Path) -> None:
    """``--max-member``: a tar input with a member over the limit stops the build with one
    line naming the shard and the member's offset; a limit above it builds; ``bench``
    takes the same flag for the loader."""
    from shardkit import ConfigError, ShardWriter
    from shardkit.format.manifest.model import incomplete_reason

    src = tmp_path / "src"
    src.mkdir()
    big = bytes(range(256)) * 1200  # 307,200 bytes
    with pytest.raises(ConfigError, match="looks like a webdataset shard pattern"):
        ShardWriter(str(src / "data-%06d.tar"))  # the habit of webdataset users
    with ShardWriter(src, maxcount=10) as w:
        w.write({"__key__": "a", "txt": b"small"})
        w.write({"__key__": "b", "bin": big})
    shard = src / "data-000000.tar"
    low = shardkit("build", shard, "-o", tmp_path / "low", "--max-member", "100KB")
    assert low.returncode == 1, low.stderr
    line = low.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, low.stderr
    assert "data-000000.tar" in line and "byte 1024" in line, line
    assert "307200 bytes" in line and "largest-member limit of 100000" in line, line
    stopped = Manifest.load(tmp_path / "low" / "manifest.json")
    assert incomplete_reason(stopped) is not None and len(stopped) == 0

    ok = shardkit("build", shard, "-o", tmp_path / "ok", "--max-member", "1MB")
    assert ok.returncode == 0, ok.stderr
    assert [s["bin"] for s in read_samples(tmp_path / "ok" / "manifest.json") if "bin" in s] == [
        big
    ]

    args = ("bench", tmp_path / "ok" / "manifest.json", "--workers", "0", "--epochs", "1")
    bench = shardkit(*args, "--max-member", "100KB")
    assert bench.returncode == 1 and "largest-member limit of 100000" in bench.stderr, bench.stderr
    assert "Traceback" not in bench.stderr
    assert shardkit(*args, "--max-member", "1MB").returncode == 0
