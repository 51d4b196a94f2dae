"""Builds a user can trust: a half-finished build never passes as good, the way out of a
failed build is named, bad records can be skipped with a report, outputs are readable by
others, folder selection, gzip in and out. Everything through the real CLI."""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ManifestError
from shardkit.format.layout import index_name
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.reader import iter_samples
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


def _failing_corpus(root: Path) -> Path:
    """5,000 records; line 3,001 of the second file is not JSON."""
    write_jsonl(root / "a.jsonl", ({"i": i, "t": "x" * (i % 50)} for i in range(2000)))
    lines = [json.dumps({"i": i}) for i in range(3000)]
    lines[3000 - 1999 - 1] = "{oops"  # line 1001 of b.jsonl: record 3,001 of the build
    (root / "b.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_a_failed_build_is_incomplete_to_verify_inspect_and_readers(tmp_path: Path) -> None:
    raw = _failing_corpus(tmp_path / "raw")
    out = tmp_path / "out"
    r = shardkit("build", raw, "-o", out, "--maxcount", "500")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr  # one line, no traceback
    assert f"{raw / 'b.jsonl'} line 1001: not valid JSON" in r.stderr
    manifest = out / "manifest.json"
    m = assert_whole(manifest)  # whole shards only, as before
    # the shard open at the failure (records 2,501-3,000) is dropped: whole shards only
    assert m.total_samples == 2500 and m.created["build"]["complete"] is False
    assert "line 1001" in m.created["build"]["stopped"]

    v = shardkit("verify", manifest)
    assert v.returncode == 1, v.stdout
    assert "incomplete: the build that wrote it did not finish" in v.stdout
    assert "b.jsonl line 1001" in v.stdout and "--resume" in v.stdout
    assert "FAILED: the manifest is incomplete" in v.stdout
    assert json.loads(shardkit("verify", manifest, "--json").stdout)["ok"] is False

    i = shardkit("inspect", manifest)
    assert i.returncode == 0 and "(INCOMPLETE)" in i.stdout and "did not finish" in i.stdout
    assert json.loads(shardkit("inspect", manifest, "--json").stdout)["incomplete"]

    with pytest.raises(ManifestError, match=r"incomplete.*allow_incomplete=True"):
        len(sk.ShardDataset(str(manifest), shardshuffle=False))
    ds = sk.ShardDataset(str(manifest), shardshuffle=False, allow_incomplete=True)
    assert len(ds) == 2500
    assert len(list(ds)) == 2500

    # the way out is named: --resume (same inputs) or --overwrite
    again = shardkit("build", raw, "-o", out, "--maxcount", "500")
    assert again.returncode == 2
    assert "unfinished build of these inputs: pass --resume" in again.stderr
    assert "--overwrite" in again.stderr
    (raw / "b.jsonl").write_text(
        "\n".join(json.dumps({"i": i}) for i in range(3000)) + "\n"
    )  # fixed: the inputs differ now
    resume = shardkit("build", raw, "-o", out, "--maxcount", "500", "--resume")
    assert resume.returncode == 2
    assert "other inputs or options (the inputs differ" in resume.stderr
    assert "pass --overwrite" in resume.stderr
    both = shardkit("build", raw, "-o", out, "--resume", "--overwrite")
    assert both.returncode == 2 and "exclude each other" in both.stderr
    (out / "data-000099.tar").write_bytes(b"stale")  # an old shard of this prefix
    (out / "notes.txt").write_text("mine")  # not the build's: kept
    ok = shardkit("build", raw, "-o", out, "--maxcount", "500", "--overwrite")
    assert ok.returncode == 0, ok.stderr
    assert not (out / "data-000099.tar").exists() and (out / "notes.txt").exists()
    assert shardkit("verify", manifest).returncode == 0
    assert assert_whole(manifest).total_samples == 5000
    before = (shard_digests(manifest), manifest.stat().st_mtime_ns)
    done = shardkit("build", raw, "-o", out, "--maxcount", "500")
    assert done.returncode == 0, done.stderr  # a finished build again: nothing to do
    assert "nothing to do" in done.stdout and "finished build of these inputs" in done.stdout
    assert (shard_digests(manifest), manifest.stat().st_mtime_ns) == before
    # re-sharding shards in place with --overwrite would delete its own inputs: refused
    inplace = shardkit("build", out / "data-000000.tar", "-o", out, "--overwrite")
    assert inplace.returncode == 2
    assert "--overwrite would delete the input" in inplace.stderr
    assert (out / "data-000000.tar").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_on_error_skip_names_each_bad_record_and_finishes(tmp_path: Path, workers: str) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", ({"tokens": [i % 100, -1]} for i in range(200)))
    bad = raw / "b.jsonl"
    good = [json.dumps({"tokens": [1, 2]})] * 300
    good[9] = '{"tokens": [1, 300]}'  # line 10: out of range for int8
    good[99] = "not json"  # line 100
    good[199] = '{"other": 1}'  # line 200: no tokens
    bad.write_text("\n".join(good) + "\n")
    args = ["--field", "tokens=npy:int8", "--maxcount", "64", "--workers", workers]

    strict = shardkit("build", raw, "-o", tmp_path / "strict", *args)
    assert strict.returncode == 1
    assert strict.stderr.strip().count("\n") == 0, strict.stderr
    assert f"{bad} line 10: field 'tokens' does not fit int8" in strict.stderr
    assert "300 out of bounds" in strict.stderr

    out = tmp_path / "out"
    r = shardkit("build", raw, "-o", out, *args, "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    report = out / "manifest.errors.jsonl"
    assert f"skipped 3 bad records: each is named in {report}" in r.stdout
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(row["source"], row["line"]) for row in rows] == [
        (str(bad), 10),
        (str(bad), 100),
        (str(bad), 200),
    ]
    assert "does not fit int8" in rows[0]["reason"]
    assert "not valid JSON" in rows[1]["reason"]
    assert "no field 'tokens'" in rows[2]["reason"]
    m = assert_whole(out / "manifest.json")
    assert m.total_samples == 497
    info = m.created["build"]
    assert info["complete"] is True and info["skipped_records"] == 3
    assert shardkit("verify", out / "manifest.json").returncode == 0
    assert "skipped 3 bad records (named in manifest.errors.jsonl)" in (
        shardkit("inspect", out / "manifest.json").stdout
    )
    assert not hidden_leftovers(out)


def test_outputs_follow_the_umask(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", ({"i": i} for i in range(50)))
    (raw / "b.jsonl").write_text('{"i": 1}\nbad\n')
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "shardkit", "build", raw, "-o", out, "--on-error", "skip"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.umask(0o022),  # the child's umask only
    )
    assert r.returncode == 0, r.stderr
    index = index_name("data-000000.tar")  # in the hidden .index/ folder
    names = [n for n in sorted(os.listdir(out)) if os.path.isfile(out / n)] + [index]
    assert {"manifest.json", "manifest.csv", "manifest.errors.jsonl"} <= set(names)
    assert os.path.isfile(out / index)
    for name in names:
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o644, name


def _image(fmt: str, n: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4 + n, 4), (n, 2 * n, 3 * n)).save(buf, format=fmt)
    return buf.getvalue()


def _tree(root: Path) -> Path:
    for d in ("a", "b"):
        (root / d).mkdir(parents=True)
    (root / "README.md").write_text("# my images")
    (root / "a" / "1.jpg").write_bytes(_image("JPEG", 1))  # real images: build checks them
    (root / "a" / "1.json").write_text("{}")
    (root / "a" / "2.JPG").write_bytes(_image("JPEG", 2))
    (root / "a" / "2.json").write_text("{}")
    (root / "b" / "3.png").write_bytes(_image("PNG", 3))
    (root / "b" / "3.json").write_text("{}")
    (root / "b" / "4.json").write_text("{}")
    return root


def test_folder_include_exclude_require_and_case_insensitive_fields(tmp_path: Path) -> None:
    src = _tree(tmp_path / "raw")
    plain = shardkit("build", src, "-o", tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    assert "README" in keys_of(read_samples(tmp_path / "plain" / "manifest.json"))
    assert "note:" in plain.stderr and "upper-case extensions (e.g. a/2.JPG)" in plain.stderr
    assert "different formats: jpg (2), png (1)" in plain.stderr
    fields = Manifest.load(tmp_path / "plain" / "manifest.json").fields
    assert fields["jpg"]["count"] == 2 and "JPG" not in fields

    need = ["--exclude", "*.md", "--require-fields", "jpg;png,json"]
    strict = shardkit("build", src, "-o", tmp_path / "strict", *need)
    assert strict.returncode == 2
    assert "1 sample without a required field (jpg|png, json): b/4 has json" in strict.stderr
    assert not (tmp_path / "strict" / "manifest.json").exists()

    out = tmp_path / "out"
    r = shardkit("build", src, "-o", out, *need, "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "left out 1 sample without jpg|png, json: b/4 has json" in r.stderr
    samples = read_samples(out / "manifest.json")
    assert keys_of(samples) == ["a/1", "a/2", "b/3"]
    assert samples[1]["jpg"] == _image("JPEG", 2)

    only = tmp_path / "only"
    r = shardkit("build", src, "-o", only, "--include", "*.JPG", "--include", "a/*.json")
    assert r.returncode == 0, r.stderr
    got = {
        s["__key__"]: sorted(k for k in s if k != "__key__")
        for s in read_samples(only / "manifest.json")
    }
    assert got == {"a/1": ["jpg", "json"], "a/2": ["jpg", "json"]}


def test_gzip_jsonl_in_gzip_shards_out_read_by_webdataset_and_shardkit(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    raw = tmp_path / "raw"
    raw.mkdir()
    with gzip.open(raw / "a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"n": i}) + "\n" for i in range(120))
    with gzip.open(raw / "b.json.gz", "wt") as f:  # JSON lines, named as C4 names them
        f.writelines(json.dumps({"n": 1000 + i}) + "\n" for i in range(80))
    out = tmp_path / "out"
    help_text = shardkit("build", "--help").stdout
    assert "uncompressed" in help_text and "gzip" in help_text
    r = shardkit("build", raw, "-o", out, "--compress", "gzip", "--maxsize", "16KB")
    assert r.returncode == 0, r.stderr
    m = Manifest.load(out / "manifest.json")
    assert m.total_samples == 200 and len(m) > 1
    assert all(s.url.endswith(".tar.gz") for s in m.shards)
    assert shardkit("verify", out / "manifest.json").returncode == 0
    urls = [str(out / s.url) for s in m.shards]
    with open(urls[0], "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    # shardkit's tar reader over the gzip stream, GNU-compatible tarfile, and webdataset
    ours = []
    for url in urls:
        with open(url, "rb") as f:
            tar = io.BytesIO(gzip.decompress(f.read()))
        ours += [json.loads(bytes(s["json"]))["n"] for _, s in iter_samples(tar, url=url)]
    assert sorted(ours) == list(range(120)) + list(range(1000, 1080))
    with tarfile.open(urls[0], "r:gz") as t:
        assert t.getnames()[0] == "a/000000001.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset 1.0 leaves a file open
        theirs = [json.loads(s["json"])["n"] for s in wds.WebDataset(urls, shardshuffle=False)]
        gc.collect()
    assert theirs == ours
    # gzip output is deterministic: the same bytes on a second build
    again = shardkit(
        "build", raw, "-o", tmp_path / "again", "--compress", "gzip", "--maxsize", "16KB"
    )
    assert again.returncode == 0
    assert [s.checksum for s in Manifest.load(tmp_path / "again" / "manifest.json").shards] == [
        s.checksum for s in m.shards
    ]


def test_a_truncated_gzip_source_names_the_file(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    data = gzip.compress(b"".join(json.dumps({"n": i}).encode() + b"\n" for i in range(5000)))
    (raw / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    r = shardkit("build", raw, "-o", tmp_path / "out")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{raw / 'cut.jsonl.gz'}: corrupt or truncated after line" in r.stderr


def test_skip_mode_resumes_after_sigkill_with_the_same_shards_and_report(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in range(4):
        lines = [json.dumps({"f": f, "i": i, "pad": "x" * 400}) for i in range(1500)]
        for i in range(f, 1500, 97):
            lines[i] = "{bad"
        (raw / f"p{f}.jsonl").write_text("\n".join(lines) + "\n")
    args = ["--maxcount", "100", "--on-error", "skip"]
    ref = shardkit("build", raw, "-o", tmp_path / "ref", *args)
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardkit", "build", str(raw), "-o", str(out), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out / "manifest.json").exists() or len(Manifest.load(out / "manifest.json")) < 3:
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = Manifest.load(out / "manifest.json")
    assert killed.created["build"]["complete"] is False
    assert shardkit("verify", out / "manifest.json").returncode == 1
    r = shardkit("build", raw, "-o", out, *args, "--resume")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("skipped 64 bad records") == 1
    assert shard_digests(out / "manifest.json") == shard_digests(tmp_path / "ref" / "manifest.json")
    assert (out / "manifest.errors.jsonl").read_text() == (
        tmp_path / "ref" / "manifest.errors.jsonl"
    ).read_text()
