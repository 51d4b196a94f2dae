"""What a build or a writer on a local disk must never do: pack records as a file tree with
``--field`` silently ignored, call an all-skipped build a success, fail a merge of parts in
sibling folders, name one set of a folder as its whole train split, or leave a bad input
unnamed (an image's buffer, a duplicate key's file and line, rows counted from 0)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.format.layout import HF_CONFIG
from shardkit.format.manifest.model import Manifest, incomplete_reason
from tests.helpers.readback import keys_of, read_samples, write_jsonl


def cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``shardkit ARGS`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as ended:
        main([str(a) for a in args])
    said = capsys.readouterr()
    return int(ended.value.code or 0), said.out, said.err


def _records(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"id": f"r{i:03d}", "text": f"hello {i}"} for i in range(start, start + n)]


def test_a_jsonl_folder_with_a_readme_is_packed_as_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "raw"
    write_jsonl(src / "a.jsonl", _records(3))
    with gzip.open(src / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in _records(2, 3))
    (src / "README.md").write_text("# my corpus\n")
    code, _, err = cli(capsys, "build", src, "-o", tmp_path / "out", "--field", "text=txt")
    assert code == 0, err
    got = read_samples(tmp_path / "out" / "manifest.json")
    assert [s["text.txt"] for s in got] == [f"hello {i}".encode() for i in range(5)]
    assert "README.md" in err and "left out" in err  # the stray document, named once


def test_field_on_a_folder_read_as_a_file_tree_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "raw"
    write_jsonl(src / "a.jsonl", _records(3))
    (src / "notes.bin").write_bytes(b"\0" * 10)
    (src / "other.bin").write_bytes(b"\0" * 10)  # mostly not records: a file tree
    code, _, err = cli(capsys, "build", src, "-o", tmp_path / "out", "--field", "text=txt")
    assert code == 2 and "--field applies to JSONL and Parquet" in err and "notes.bin" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skip_that_leaves_out_every_record_is_an_error_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "raw" / "a.jsonl", _records(4))
    out = tmp_path / "out"
    code, _, err = cli(
        capsys, "build", src, "-o", out, "--field", "txet=txt", "--on-error", "skip", "--json"
    )
    assert code == 1 and "every record was skipped (4)" in err and "'txet'" in err, err
    said = incomplete_reason(Manifest.load(out / "manifest.json"))
    assert said is not None  # verify fails on it: no empty set called OK
    # some skipped, some kept: a success whose --json says how many were skipped
    write_jsonl(src, [*_records(2), {"id": "bad"}])
    code, stdout, err = cli(
        capsys, "build", src, "-o", out, "--field", "text=txt", "--on-error", "skip",
        "--json", "--overwrite",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(stdout)["skipped_records"] == 1 and json.loads(stdout)["samples"] == 2


def test_merge_of_parts_in_sibling_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(2):  # the Slurm pattern: one folder per task
        with sk.ShardWriter(tmp_path / f"part-{i:04d}", part=(i, 2), maxcount=2) as w:
            for r in range(3):
                w.write({"__key__": f"p{i}/{r}", "txt": f"{i}-{r}"})
    parts = [tmp_path / f"part-{i:04d}" / "manifest.json" for i in range(2)]
    code, _, err = cli(capsys, "manifest", "merge", *parts, "-o", tmp_path / "manifest.json")
    assert code == 0, err
    m = Manifest.load(tmp_path / "manifest.json")
    assert [s.url for s in m.shards][:1] == ["part-0000/data-000000.tar"]
    assert keys_of(read_samples(m)) == [f"p{i}/{r}" for i in range(2) for r in range(3)]


def test_huggingface_config_names_every_set_of_a_folder(tmp_path: Path) -> None:
    for prefix, manifest in (("train", "manifest.json"), ("val", "val.json")):
        with sk.ShardWriter(tmp_path, prefix=prefix, manifest=manifest) as w:
            w.write({"__key__": f"{prefix}-0", "txt": prefix})
    text = (tmp_path / HF_CONFIG).read_text()
    train, val = text.index("- split: train"), text.index("- split: validation")
    assert train < text.index('- "train-*.tar"') < val < text.index('- "val-*.tar"'), text
    with sk.ShardWriter(tmp_path, prefix="train", overwrite=True) as w:  # rewritten: still both
        w.write({"__key__": "train-1", "txt": "again"})
    again = (tmp_path / HF_CONFIG).read_text()
    assert '"train-*.tar"' in again and '"val-*.tar"' in again


def test_a_url_a_writer_cannot_serve_never_says_its_credentials(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        sk.ShardWriter("http://user:SeCrEt9@host.example/x/")
    assert "SeCrEt9" not in str(info.value) and "local directory" in str(info.value)


def test_a_bad_image_names_its_file_and_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for what, data in (("empty", b""), ("garbage", b"this is no jpeg")):
        src = tmp_path / what
        src.mkdir()
        (src / "a.jpg").write_bytes(data)
        (src / "a.json").write_text("{}")
        code, _, err = cli(capsys, "build", src, "-o", tmp_path / f"out-{what}")
        assert code == 1 and str(src / "a.jpg") in err, err
        assert "BytesIO" not in err
        assert ("empty (0 bytes)" if what == "empty" else "start b'this is ") in err


def test_a_duplicate_key_names_its_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", [*_records(2), {"id": "r000", "text": "twice"}])
    code, _, err = cli(capsys, "build", src, "-o", tmp_path / "out", "--key-field", "id")
    assert code == 1 and f"{src} line 3" in err and "'r000' appears twice" in err, err


def test_parquet_and_jsonl_count_and_key_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{**r, "tokens": [1, 2]} for r in _records(3)]
    rows[2]["tokens"] = [1000]  # more than an int8 holds
    write_jsonl(tmp_path / "j" / "a.jsonl", rows)
    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p" / "a.parquet")
    got = {}
    for kind in ("j", "p"):
        out = tmp_path / f"out-{kind}"
        code, _, err = cli(capsys, "build", tmp_path / kind, "-o", out, "--key-field", "id")
        assert code == 0, err
        got[kind] = [json.loads(s["json"]) for s in read_samples(out / "manifest.json")]
        # a record the field map cannot take is named at the same count: line 3, row 3
        code, _, err = cli(capsys, "build", tmp_path / kind, "-o", tmp_path / f"bad-{kind}",
                           "--key-field", "id", "--field", "tokens=npy:int8")  # fmt: skip
        assert code == 1 and ("line 3" if kind == "j" else "row 3") in err, err
    assert got["j"][0] == got["p"][0] == {"id": "r000", "text": "hello 0", "tokens": [1, 2]}
