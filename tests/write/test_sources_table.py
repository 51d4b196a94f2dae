"""Parquet and Arrow tables as build sources: rows to samples, Hub conventions, row groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from shardkit.errors import ConfigError, WriterError
from shardkit.format.codecs import decode_field
from shardkit.write.inputs.discover import discover
from shardkit.write.inputs.records import read_units
from shardkit.write.inputs.sources import SourceError, SourceOptions, parse_field_spec
from tests.helpers.data import tiny_image

_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hub_table(n: int, start: int = 0) -> pa.Table:
    """Rows as a Hub data set stores them: an Image struct, a binary, text and a label."""
    rows = range(start, start + n)
    return pa.table(
        {
            "image": pa.array(
                [{"bytes": tiny_image(i), "path": f"img_{i}.PNG"} for i in rows], _IMAGE
            ),
            "audio": pa.array(
                [None if i % 3 == 0 else {"bytes": b"RIFF", "path": "a.wav"} for i in rows],
                _IMAGE,
            ),
            "npy": pa.array([np.arange(i % 4, dtype="<i4").tobytes() for i in rows], pa.binary()),
            "text": [f"caption {i}" for i in rows],
            "label": list(rows),
            "tokens": [list(range(i % 5)) for i in rows],
            "id": [f"doc{i:04d}" for i in rows],
        }
    )


def _samples(units: Any, opts: SourceOptions | None = None) -> list[dict[str, Any]]:
    return [s for s, _ in read_units(units, opts) if s is not None]


def test_parquet_rows_become_samples_the_hub_way(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(hub_table(7), path)
    got = _samples(discover([str(path)]))
    assert [s["__key__"] for s in got] == [f"train/{i:09d}" for i in range(7)]
    first = got[1]
    assert first["image.png"] == tiny_image(1)  # the path's extension, lower-cased
    assert first["audio.wav"] == b"RIFF"
    assert "audio.wav" not in got[0]  # a null leaves the member out
    assert first["npy"] == np.arange(1, dtype="<i4").tobytes()
    assert json.loads(first["json"]) == {
        "text": "caption 1",
        "label": 1,
        "tokens": [0],
        "id": "doc0001",
    }


def test_field_maps_and_key_field(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(hub_table(4), path)
    opts = SourceOptions(
        (parse_field_spec("tokens=npy:int32"), parse_field_spec("text=txt")), key_field="id"
    )
    got = _samples(discover([str(path)]), opts)
    s = got[3]
    assert s["__key__"] == "doc0003"
    assert s["text.txt"] == b"caption 3"
    arr = decode_field("doc0003", "tokens.npy", s["tokens.npy"])
    assert arr.dtype == np.int32 and arr.tolist() == [0, 1, 2]
    assert json.loads(s["json"]) == {"label": 3, "id": "doc0003"}  # the key kept, as JSONL


def test_row_groups_are_units_and_keys_count_rows_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    pq.write_table(hub_table(25), path, row_group_size=10)
    units = discover([str(path)])
    assert [u.group for u in units] == [0, 1, 2]
    assert sum(u.size for u in units) == path.stat().st_size
    keys = [s["__key__"] for s in _samples(units[1:2])]
    assert keys == [f"big/{i:09d}" for i in range(10, 20)]
    # bytes reported add up to the unit sizes, as for the other sources
    assert sum(b for _, b in read_units(units)) == path.stat().st_size


def test_arrow_ipc_file_and_stream(tmp_path: Path) -> None:
    table = hub_table(5)
    for name, writer in (("f.arrow", pa.ipc.new_file), ("s.arrow", pa.ipc.new_stream)):
        with pa.OSFile(str(tmp_path / name), "wb") as sink, writer(sink, table.schema) as w:
            w.write_table(table, max_chunksize=2)
    units = discover([str(tmp_path)])
    assert [u.kind for u in units] == ["table", "table"]
    got = _samples(units)
    assert [s["__key__"] for s in got] == [f"{p}/{i:09d}" for p in ("f", "s") for i in range(5)]


def test_path_only_image_and_bad_options_are_named(tmp_path: Path) -> None:
    path = tmp_path / "ext.parquet"
    table = pa.table({"image": pa.array([{"bytes": None, "path": "/data/x.jpg"}], _IMAGE)})
    pq.write_table(table, path)
    with pytest.raises(SourceError, match=r"ext.parquet: row 1: .*'/data/x.jpg'"):
        _samples(discover([str(path)]))
    with pytest.raises(ConfigError, match="--key-field 'nope'"):
        _samples(discover([str(path)]), SourceOptions(key_field="nope"))
    with pytest.raises(ConfigError, match="--field 'nope'"):
        _samples(discover([str(path)]), SourceOptions((parse_field_spec("nope=txt"),)))


def test_not_parquet_is_a_data_error(tmp_path: Path) -> None:
    """Damaged input, not a usage error (issue 20: the CLI exits 1, not 2 with usage)."""
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(WriterError, match=r"fake\.parquet: cannot read as Parquet"):
        discover([str(path)])
