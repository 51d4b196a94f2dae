"""Hugging Face ``datasets`` and shardkit, both ways, offline: its webdataset loader reads
shardkit shards, and shardkit builds shards from the Parquet it writes (Image features
included)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from shardkit.format.codecs import decode_field
from tests.helpers.data import make_shards
from tests.helpers.readback import read_samples, shardkit

pytestmark = pytest.mark.integration


def test_hf_webdataset_loader_reads_shardkit_shards(hf: Any, tmp_path: Path) -> None:
    m = make_shards(tmp_path / "s", [3, 4, 2])
    paths = [str(tmp_path / "s" / s.url) for s in m.shards]
    ds = hf.load_dataset(
        "webdataset", data_files={"train": paths}, split="train", cache_dir=str(tmp_path / "c")
    )
    ours = read_samples(tmp_path / "s" / "manifest.json")
    assert ds["__key__"] == [s["__key__"] for s in ours]
    row = ds[4]
    assert row["json"] == {"id": 4, "text": "document 4"}
    tokens = decode_field(str(ours[4]["__key__"]), "tokens.npy", ours[4]["tokens.npy"])
    assert list(row["tokens.npy"]) == tokens.tolist()


def _png(i: int) -> Image.Image:
    return Image.new("RGB", (4 + i, 3), color=(i, 2 * i, 3 * i))


def test_shardkit_builds_from_hf_parquet_with_images(hf: Any, tmp_path: Path) -> None:
    n = 12
    ds = hf.Dataset.from_dict(
        {"image": [_png(i) for i in range(n)], "caption": [f"c{i}" for i in range(n)]}
    ).cast_column("image", hf.Image())
    ds.to_parquet(str(tmp_path / "train.parquet"))
    r = shardkit("build", tmp_path / "train.parquet", "-o", tmp_path / "out", "--field",
                 "caption=txt")  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = read_samples(tmp_path / "out" / "manifest.json")
    assert [s["__key__"] for s in got] == [f"train/{i:09d}" for i in range(n)]
    s = got[5]
    assert s["caption.txt"] == b"c5"
    img = Image.open(io.BytesIO(s["image.png"]))  # no path: the extension from the bytes
    assert img.size == (9, 3) and img.convert("RGB").getpixel((0, 0)) == (5, 10, 15)
