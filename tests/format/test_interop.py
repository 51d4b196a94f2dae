"""Interop with the real readers and writers of the format: webdataset, GNU tar, tarfile."""

from __future__ import annotations

import gc
import io
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from click.testing import CliRunner

from shardkit import Manifest, ShardWriter, read_shard
from shardkit.cli import cli

pytestmark = pytest.mark.integration

META = ("__url__", "__local_path__")


def _samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Samples with dirs, unicode, long (pax) keys, empty and binary fields."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        key = [f"plain{i:04d}", f"dir/sub/k{i:04d}", f"ünï/ключ{i}", "long/" + "x" * 120 + str(i)]
        out.append(
            {
                "__key__": key[i % 4],
                "txt": f"text {i} é".encode(),
                "bin": rng.bytes(int(rng.integers(0, 5000))),
                "empty.dat": b"",
                "tokens.npy": rng.bytes(64),
            }
        )
    return out


def _write(out: Path, samples: list[dict[str, Any]], **kw: Any) -> Manifest:
    with ShardWriter(out, **kw) as w:
        for s in samples:
            w.write(s)
    return Manifest.load(out / "manifest.json")


def _strip(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k not in META}


def test_webdataset_reads_shardkit_shards(tmp_path: Path) -> None:
    samples = _samples(40)
    m = _write(tmp_path, samples, maxsize="40KB")
    assert len(m.shards) > 2
    urls = [str(tmp_path / e.url) for e in m.shards]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset 1.0 leaves a file open
        got = [_strip(s) for s in wds.WebDataset(urls, shardshuffle=False)]
        gc.collect()
    assert got == samples


def test_shardkit_reads_webdataset_shard_writer(tmp_path: Path) -> None:
    samples = _samples(30, seed=1)
    with wds.ShardWriter(
        str(tmp_path / "wds-%06d.tar"), maxcount=12, verbose=0, encoder=False
    ) as sink:
        for s in samples:
            sink.write(s)
    paths = sorted(tmp_path.glob("wds-*.tar"))
    assert len(paths) == 3
    got = [s for p in paths for s in read_shard(p)]
    assert got == samples
    # a manifest for them, and a deep verify of it (sizes, checksums, counts, indexes)
    runner = CliRunner()
    made = runner.invoke(cli, ["manifest", "from-shards", str(tmp_path)], catch_exceptions=False)
    assert made.exit_code == 0, made.output
    m = Manifest.load(tmp_path / "manifest.json")
    assert [e.nsamples for e in m.shards] == [12, 12, 6]
    checked = runner.invoke(cli, ["verify", "--deep", str(tmp_path / "manifest.json")])
    assert checked.exit_code == 0, checked.output


def test_shardkit_reads_webdataset_tar_writer_with_encoding(tmp_path: Path) -> None:
    arr = np.arange(10, dtype=np.int32)
    path = tmp_path / "enc.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write({"__key__": "a/b", "txt": "héllo", "cls": 3, "json": {"x": 1}, "npy": arr})
    (s,) = list(read_shard(path))
    assert s["__key__"] == "a/b" and s["txt"] == "héllo".encode() and s["cls"] == b"3"
    assert np.array_equal(np.load(io.BytesIO(s["npy"])), arr)  # type: ignore[arg-type]


@pytest.fixture
def gnu_tar() -> str:
    tar = shutil.which("tar")
    assert tar is not None, "GNU tar is part of the test environment"
    version = subprocess.run([tar, "--version"], capture_output=True, text=True, check=True)
    assert "GNU tar" in version.stdout
    return tar


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_gnu_tar_lists_and_extracts_shardkit_shards(
    tmp_path: Path, gnu_tar: str, compress: str | None
) -> None:
    samples = _samples(12, seed=2)
    m = _write(tmp_path / "out", samples, compress=compress)
    (entry,) = m.shards
    shard = tmp_path / "out" / entry.url
    flags = ["--zstd"] if compress else []
    listing = subprocess.run(
        [gnu_tar, *flags, "-tf", str(shard)], capture_output=True, text=True, check=True
    )
    names = [f"{s['__key__']}.{f}" for s in samples for f in s if f != "__key__"]
    assert listing.stdout.splitlines() == names
    assert listing.stderr == ""
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run([gnu_tar, *flags, "-xf", str(shard), "-C", str(dest)], check=True)
    for s in samples:
        for field, value in s.items():
            if field != "__key__":
                assert (dest / f"{s['__key__']}.{field}").read_bytes() == value


def test_gnu_tar_shards_read_back(tmp_path: Path, gnu_tar: str) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"d/a.txt": b"alpha", "d/a.json": b"{}", "b.bin": bytes(range(256)) * 3}
    files["d/" + "n" * 150 + ".txt"] = b"long name"
    for name, data in files.items():
        (src / name).write_bytes(data)
    shard = tmp_path / "gnu.tar"
    for fmt in ("gnu", "posix", "ustar"):
        names = sorted(files) if fmt != "ustar" else sorted(n for n in files if len(n) < 100)
        subprocess.run(
            [gnu_tar, f"--format={fmt}", "-cf", str(shard), "-C", str(src), *names], check=True
        )
        got = {
            f"{s['__key__']}.{k}": v
            for s in read_shard(shard)
            for k, v in s.items()
            if k != "__key__"
        }
        assert got == {n: files[n] for n in names}, fmt


def test_tarfile_pax_shard_with_long_unicode_names(tmp_path: Path) -> None:
    members = {
        "ключи/" + "д" * 80 + "/образец.txt": "текст".encode(),
        "ключи/" + "д" * 80 + "/образец.json": b'{"a": 1}',
        "日本語/" + "長" * 60 + ".bin": b"\x00\x01" * 1000,
        "plain.txt": b"",
    }
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000.5  # a float mtime makes tarfile add a pax record too
            tf.addfile(info, io.BytesIO(data))
    got = list(read_shard(path))
    assert got == [
        {
            "__key__": "ключи/" + "д" * 80 + "/образец",
            "txt": "текст".encode(),
            "json": b'{"a": 1}',
        },
        {"__key__": "日本語/" + "長" * 60, "bin": b"\x00\x01" * 1000},
        {"__key__": "plain", "txt": b""},
    ]
