"""``shardkit verify``: the real CLI against shards the tests make and then damage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from shardkit import Manifest, ShardWriter
from shardkit.cli import cli
from shardkit.format.checksum import file_checksum
from shardkit.format.layout import index_name
from shardkit.format.tario.index import index_entry_range
from tests.helpers import hostile
from tests.helpers.data import make_samples

pytestmark = pytest.mark.integration

LEVELS = ["--quick", "--checksum", "--deep"]


def run(*args: str) -> Result:
    argv = ["verify", *[a for a in args if a != "--checksum"]]
    return CliRunner().invoke(cli, argv, catch_exceptions=False)


@pytest.fixture
def shards(make_shards: Callable[..., Manifest], tmp_path: Path) -> Path:
    make_shards([4, 3, 5], subdir="set")
    return tmp_path / "set" / "manifest.json"


def _edit(manifest: Path, i: int, **changes: Any) -> None:
    m = Manifest.load(manifest)
    m.shards[i] = replace(m.shards[i], **changes)
    m.save(manifest)


def _report(*args: str) -> dict[str, Any]:
    result = run(*args, "--json")
    report: dict[str, Any] = json.loads(result.stdout)
    assert result.exit_code == (0 if report["ok"] else 1)
    return report


def _adopt(manifest: Path, i: int) -> None:
    """Make the manifest agree with shard ``i``'s bytes (size and checksum) as they are now;
    its piece checksums are dropped, as an older manifest has none, and its sample index
    (of the old bytes, which plain verify would report as another shard's)."""
    m = Manifest.load(manifest)
    path = manifest.parent / m.shards[i].url
    with open(path, "rb") as f:
        checksum, size = file_checksum(f, m.checksum_algorithm)
    m.shards[i] = replace(
        m.shards[i], size=size, checksum=checksum, pieces=None, index=None, index_checksum=None
    )
    m.save(manifest)


@pytest.mark.parametrize("level", LEVELS)
def test_good_data_exits_0(shards: Path, level: str) -> None:
    result = run(str(shards), level)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("OK: 3 shards")
    assert "FAIL" not in result.output


@pytest.mark.parametrize("level", ["--checksum", "--deep"])
def test_flipped_byte(shards: Path, level: str) -> None:
    path = shards.parent / "data-000001.tar"
    data = bytearray(path.read_bytes())
    data[700] ^= 0x01  # inside the first member's payload
    path.write_bytes(bytes(data))
    result = run(str(shards), level)
    assert result.exit_code == 1
    assert "FAIL data-000001.tar: checksum: checksum differs (expected sha256:" in result.stdout
    assert "data-000000.tar" not in result.stdout and "data-000002.tar" not in result.stdout
    assert run(str(shards), "--quick").exit_code == 0  # a quick check looks at sizes only


def test_flipped_header_byte_is_a_format_problem_in_deep_mode(shards: Path) -> None:
    path = shards.parent / "data-000002.tar"
    data = bytearray(path.read_bytes())
    data[2048 + 10] ^= 0x20  # the name of sample 1's first member: its header checksum breaks
    path.write_bytes(bytes(data))
    report = _report(str(shards), "--deep")
    kinds = {p["kind"]: p for p in report["problems"]}
    assert set(kinds) == {"checksum", "format"}
    assert kinds["format"]["offset"] == 2048 and kinds["format"]["url"] == "data-000002.tar"
    assert "bad header checksum" in kinds["format"]["message"]


@pytest.mark.parametrize("level", LEVELS)
def test_truncated_shard(shards: Path, level: str) -> None:
    path = shards.parent / "data-000000.tar"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 1500)
    report = _report(str(shards), level)
    problems = {p["kind"]: p for p in report["problems"]}
    assert problems["size"] == {
        "url": "data-000000.tar",
        "kind": "size",
        "message": "size differs",
        "expected": size,
        "found": size - 1500,
        "offset": None,
    }
    if level != "--quick":
        assert "checksum" in problems
    if level == "--deep":
        assert "truncated" in problems["format"]["message"]
    assert report["bad_shards"] == ["data-000000.tar"]


@pytest.mark.parametrize("level", LEVELS)
def test_missing_shard(shards: Path, level: str) -> None:
    (shards.parent / "data-000002.tar").unlink()
    result = run(str(shards), level)
    assert result.exit_code == 1
    assert "FAIL data-000002.tar: missing: shard is missing" in result.stdout
    assert "1 problem in 1 of 3 shards" in result.stdout


def test_extra_sample_in_a_rewritten_shard(shards: Path, tmp_path: Path) -> None:
    m = Manifest.load(shards)
    first = m.shards[0].nsamples + m.shards[1].nsamples
    with ShardWriter(tmp_path / "re") as w:  # shard 2 again, with one more sample
        for s in make_samples(m.shards[2].nsamples + 1, start=first):
            w.write(s)
    shutil.copy(tmp_path / "re" / "data-000000.tar", shards.parent / "data-000002.tar")
    result = run(str(shards), "--deep")
    assert result.exit_code == 1
    assert "FAIL data-000002.tar: size: size differs" in result.stdout
    assert "FAIL data-000002.tar: nsamples: sample count differs (expected 5, found 6)" in (
        result.stdout
    )
    assert run(str(shards)).exit_code == 1  # the default level sees the changed bytes too


def test_wrong_sample_count_in_the_manifest_only_deep_sees(shards: Path) -> None:
    _edit(shards, 1, nsamples=4)
    plain = run(str(shards))  # the index's count differs (lookups refuse it): plain sees that
    assert plain.exit_code == 1 and "has a different count (expected 4, found 3)" in plain.stdout
    _edit(shards, 1, index=None, index_checksum=None)
    assert run(str(shards)).exit_code == 0
    result = run(str(shards), "--deep")
    assert result.exit_code == 1
    assert "data-000001.tar: nsamples: sample count differs (expected 4, found 3)" in result.stdout


@pytest.mark.parametrize("level", LEVELS)
def test_wrong_size_in_the_manifest(shards: Path, level: str) -> None:
    real = (shards.parent / "data-000001.tar").stat().st_size
    _edit(shards, 1, size=real + 512)
    result = run(str(shards), level)
    assert result.exit_code == 1
    assert (
        f"FAIL data-000001.tar: size: size differs (expected {real + 512}, found {real})"
        in result.stdout
    )


def test_bad_sample_index(shards: Path) -> None:
    idx = shards.parent / index_name("data-000000.tar")
    data = bytearray(idx.read_bytes())
    data[index_entry_range(2, version=2)[0]] += 1  # sample 2's offset
    idx.write_bytes(bytes(data))
    report = _report(str(shards), "--deep")
    assert [(p["kind"], p["expected"], p["found"]) for p in report["problems"]] == [
        ("index", 4096, 4097)
    ]
    assert "sample 2" in report["problems"][0]["message"]
    idx.write_bytes(b"garbage!" * 4)
    assert "not a shardkit sample index" in run(str(shards), "--deep").stdout
    idx.unlink()
    assert "data-000000.tar: index:" in run(str(shards), "--deep").stdout


def test_hostile_member_is_reported_by_deep(shards: Path) -> None:
    case = next(c for c in hostile.cases() if c.name == "symlink")
    (shards.parent / "data-000001.tar").write_bytes(case.data)
    _adopt(shards, 1)
    assert run(str(shards)).exit_code == 0  # bytes match the manifest...
    report = _report(str(shards), "--deep")  # ...but the shard is hostile
    (problem,) = [p for p in report["problems"] if p["kind"] == "format"]
    assert problem["offset"] == case.offset and "symbolic link" in problem["message"]


def test_unsafe_url_is_a_problem_not_a_read(shards: Path) -> None:
    _edit(shards, 0, url="../../etc/passwd")
    report = _report(str(shards))
    assert report["problems"][0]["kind"] == "url"
    assert "refusing" in report["problems"][0]["message"]


@pytest.mark.parametrize(
    "text",
    ["{not json", '{"format": "shardkit.manifest", "version": 99, "shards": []}', ""],
)
def test_malformed_manifest_is_a_problem_found(tmp_path: Path, text: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(text)
    result = run(str(path))
    assert result.exit_code == 1
    assert "cannot read manifest" in result.stderr and str(path) in result.stderr


def test_missing_manifest_with_json_prints_a_json_report(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.json")
    result = run(absent, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["manifest"] == absent
    assert [(p["url"], p["kind"]) for p in report["problems"]] == [(absent, "manifest")]
    assert "cannot read manifest" in report["problems"][0]["message"]
    assert result.stderr == ""


def test_usage_errors_exit_2(shards: Path, tmp_path: Path) -> None:
    assert run(str(tmp_path / "absent.json")).exit_code == 1
    assert run(str(shards), "--jobs", "0").exit_code == 2
    assert run().exit_code == 2


def test_json_report_and_jobs_give_the_same_answer(shards: Path) -> None:
    (shards.parent / "data-000000.tar").unlink()
    path = shards.parent / "data-000002.tar"
    path.write_bytes(path.read_bytes()[:-1024])
    one = _report(str(shards), "--deep")
    two = _report(str(shards), "--deep", "--jobs", "2")
    one.pop("seconds"), two.pop("seconds")
    assert one == two
    assert one["ok"] is False and one["bad_shards"] == ["data-000000.tar", "data-000002.tar"]
    assert [p["kind"] for p in one["problems"]] == ["missing", "size", "checksum", "format"]


def test_extra_files_are_a_warning_not_an_error(shards: Path) -> None:
    shutil.copy(shards.parent / "data-000000.tar", shards.parent / "data-000099.tar")
    (shards.parent / "notes.txt").write_text("not a shard")
    result = run(str(shards))
    assert result.exit_code == 0
    assert result.stderr.strip() == "warning: extra file not in the manifest: data-000099.tar"
    assert _report(str(shards))["warnings"] == ["extra file not in the manifest: data-000099.tar"]


def test_csv_manifest_and_zstd_shards(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, maxcount=4, compress="zstd", checksum="xxh3_128") as w:
        for s in make_samples(10):
            w.write(s)
    for level in LEVELS:
        assert run(str(tmp_path / "manifest.json"), level).exit_code == 0
        assert run(str(tmp_path / "manifest.csv"), level).exit_code == 0
    _edit(tmp_path / "manifest.json", 2, nsamples=3)
    result = run(str(tmp_path / "manifest.json"), "--deep")
    assert "data-000002.tar.zst: nsamples: sample count differs (expected 3, found 2)" in (
        result.stdout
    )


def test_progress_bar_goes_to_stderr(shards: Path) -> None:
    result = run(str(shards), "--progress")
    assert result.exit_code == 0
    assert "verify (checksum)" in result.stderr and "B/s" in result.stderr
    assert "verify" not in result.stdout.replace("verify (", "")


def test_installed_entry_point_exit_codes(shards: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    cmd = [sys.executable, "-m", "shardkit", "verify", str(shards), "--quick"]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    (shards.parent / "data-000001.tar").unlink()
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "missing" in bad.stdout
    shards.write_text("{")
    broken = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert broken.returncode == 1 and "cannot read manifest" in broken.stderr


def test_verify_over_http(shards: Path) -> None:
    from tests.helpers.servers import RangeServer

    with RangeServer(shards.parent) as server:
        url = server.url("manifest.json")
        for level in LEVELS:
            result = run(url, level)
            assert result.exit_code == 0, result.output
        assert server.requests("*.idx"), "deep mode reads the sample index over HTTP"
        d = shards.parent
        sizes = [e.size for e in Manifest.load(shards).shards]
        with open(d / "data-000000.tar", "r+b") as f:
            f.truncate(5120)
        (d / "data-000002.tar").unlink()
        with open(d / "data-000001.tar", "ab") as f:
            f.write(b"\0" * 512)
        quick = run(url, "--quick")
        assert quick.exit_code == 1
        for i, sign in ((0, "<"), (1, ">")):
            want = f"data-00000{i}.tar: size: size differs (expected {sizes[i]}, found {sign} "
            assert want in quick.stdout
        for level in LEVELS:
            report = _report(url, level)
            kinds = [(p["url"], p["kind"]) for p in report["problems"]]
            assert ("data-000002.tar", "missing") in kinds
            assert ("data-000000.tar", "size") in kinds and ("data-000001.tar", "size") in kinds
            assert report["warnings"] == []  # extra files are looked for beside local shards only


def test_corrupt_zstd_shard_in_deep_mode(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, maxcount=5, compress="zstd") as w:
        for s in make_samples(10):
            w.write(s)
    path = tmp_path / "data-000001.tar.zst"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    _adopt(tmp_path / "manifest.json", 1)  # the manifest agrees with the damaged bytes
    assert run(str(tmp_path / "manifest.json")).exit_code == 0
    report = _report(str(tmp_path / "manifest.json"), "--deep")
    (problem,) = report["problems"]
    assert problem["kind"] == "format" and problem["url"] == "data-000001.tar.zst"
    assert "zstd" in problem["message"]


def test_library_api_progress_and_bad_level(shards: Path) -> None:
    from shardkit import ConfigError
    from shardkit.cache import make_opener
    from shardkit.check.verify import verify

    m = Manifest.load(shards)
    for level in ("quick", "checksum", "deep"):
        seen: list[int] = []
        report = verify(m, level=level, progress=seen.append, jobs=2, opener=make_opener())
        assert report.ok and report.shards == 3
        assert sum(seen) == m.total_bytes  # the bar ends exactly at the total
    with pytest.raises(ConfigError, match="level"):
        verify(m, level="thorough", opener=make_opener())


def test_pieces_of_another_shard_are_a_pieces_problem(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, maxcount=20, piece_size="8KB") as w:
        for s in make_samples(40, tokens=600):
            w.write(s)
    manifest = tmp_path / "manifest.json"
    m = Manifest.load(manifest)
    assert m.shards[0].pieces is not None and len(m.shards[0].pieces.digests) > 3
    assert run(str(manifest)).exit_code == 0
    digests = list(m.shards[0].pieces.digests)
    digests[2] = m.shards[1].pieces.digests[2]  # type: ignore[union-attr]
    _edit(manifest, 0, pieces=replace(m.shards[0].pieces, digests=tuple(digests)))
    for level in ("--checksum", "--deep"):
        report = _report(str(manifest), level)
        (problem,) = report["problems"]
        assert problem["kind"] == "pieces" and problem["url"] == "data-000000.tar"
        assert (
            problem["offset"] == 2 * 8000 and "piece 2 (bytes 16000..24000)" in problem["message"]
        )
    # a corrupt shard is a checksum problem, at the first byte of its first bad piece
    _edit(manifest, 0, pieces=m.shards[0].pieces)
    path = tmp_path / "data-000001.tar"
    data = bytearray(path.read_bytes())
    data[3 * 8000 + 100] ^= 0x01
    path.write_bytes(bytes(data))
    (problem,) = _report(str(manifest))["problems"]
    assert problem["kind"] == "checksum" and problem["offset"] == 3 * 8000


def test_a_manifest_with_pieces_that_do_not_add_up_is_refused(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, maxcount=20, piece_size="8KB") as w:
        for s in make_samples(20, tokens=600):
            w.write(s)
    manifest = tmp_path / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["shards"][0]["pieces"]["digests"].pop()
    manifest.write_text(json.dumps(raw))
    result = run(str(manifest))
    assert result.exit_code == 1
    assert "entry 0" in result.output and "pieces" in result.output and "digests" in result.output


def test_verify_decode_names_the_sample_whose_field_does_not_decode(tmp_path: Path) -> None:
    """A truncated JPEG and text named .jpg pass the checksum and --deep; --decode names
    shard, key and field (issue 20)."""
    import io

    import numpy as np
    from PIL import Image

    import shardkit as sk
    from tests.helpers.readback import shardkit

    buf = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(buf, format="JPEG")
    jpg = buf.getvalue()
    out = tmp_path / "set"
    with sk.ShardWriter(out, maxcount=10) as w:
        w.write({"__key__": "good", "jpg": jpg, "json": b'{"a": 1}', "txt": b"hi"})
        w.write({"__key__": "cut", "jpg": jpg[: len(jpg) // 2]})
        w.write({"__key__": "text", "jpg": b"this is not an image"})
        w.write({"__key__": "arr", "npy": b"\x93NUMPY broken", "json": b"{nope"})
    manifest = out / "manifest.json"
    assert shardkit("verify", manifest, "--deep").returncode == 0
    r = shardkit("verify", manifest, "--decode")
    assert r.returncode == 1, r.stdout + r.stderr
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL ")]
    assert len(fails) == 4, r.stdout
    for key, field in (("cut", "jpg"), ("text", "jpg"), ("arr", "npy"), ("arr", "json")):
        assert any(
            "data-000000.tar" in f and f"sample '{key}' field '{field}'" in f for f in fails
        ), (key, field, r.stdout)
    from shardkit.cache import make_opener
    from shardkit.check.verify import verify

    report = verify(sk.Manifest.load(manifest), level="decode", opener=make_opener())
    assert sorted((p.kind, p.message.split(":")[0]) for p in report.problems) == sorted(
        ("decode", f"sample '{k}' field '{f}'")
        for k, f in (("cut", "jpg"), ("text", "jpg"), ("arr", "npy"), ("arr", "json"))
    )


def test_counts_in_the_summary_agree_with_their_nouns(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    make_shards([2], subdir="one")
    manifest = tmp_path / "one" / "manifest.json"
    ok = run(str(manifest))
    assert "OK: 1 shard, " in ok.stdout, ok.stdout
    (tmp_path / "one" / "data-000000.tar").unlink()
    bad = run(str(manifest))
    assert "FAILED: 1 problem in 1 of 1 shard (1 shard, " in bad.stdout, bad.stdout
