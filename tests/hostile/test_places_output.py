"""Hostile places: what the output already holds is never replaced without ``overwrite`` or
``resume``, in a folder or a bucket alike, also by a writer of another manifest name whose
shards would take the same names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.cli import main
from shardkit.errors import ConfigError
from tests.helpers.stores import Store, moto_store


def _write(out: str, tag: str, **kw: object) -> None:
    with sk.ShardWriter(out, **kw) as w:  # type: ignore[arg-type]
        for i in range(3):
            w.write({"__key__": f"{tag}{i}", "txt": f"{tag} {i}"})


def _keys(manifest: str) -> list[str]:
    return sorted(s["__key__"] for s in sk.ShardDataset(manifest))


@pytest.fixture(scope="module")
def s3() -> Iterator[Store]:
    with moto_store() as s:
        yield s


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_a_second_manifest_never_takes_anothers_shard_names(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    out = str(tmp_path) if where == "folder" else request.getfixturevalue("s3").url("twin/")
    _write(out, "train")  # manifest.json, data-000000.tar
    with pytest.raises(ConfigError, match=r"data-000000\.tar.*(prefix|overwrite)"):
        _write(out, "val", manifest="val.json")  # the same prefix: data-000000.tar again
    assert _keys(f"{out.rstrip('/')}/manifest.json") == ["train0", "train1", "train2"]
    _write(out, "val", manifest="val.json", prefix="val")  # its own names: written
    assert _keys(f"{out.rstrip('/')}/val.json") == ["val0", "val1", "val2"]


@pytest.mark.parametrize("where", ["folder", "bucket"])
@pytest.mark.parametrize("command", ["merge", "from-shards"])
def test_a_manifest_command_never_replaces_another_set_unasked(
    where: str, command: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "folder":
        out = str(tmp_path / "set")
    else:
        out = request.getfixturevalue("s3").url(f"m-{command}/").rstrip("/")
    _write(out, "orig")  # a finished set: out/manifest.json
    for i in range(2):
        _write(f"{out}/part-{i:04d}", f"p{i}", part=(i, 2))
    if command == "merge":
        args = ["merge", *(f"{out}/part-{i:04d}/manifest.json" for i in range(2))]
    else:
        args = ["from-shards", f"{out}/part-0000/data-{{000000..000000}}.tar"]
    with pytest.raises(SystemExit) as info:
        main(["manifest", *args, "-o", f"{out}/manifest.json"])
    assert info.value.code != 0  # refused, naming --overwrite
    assert _keys(f"{out}/manifest.json") == ["orig0", "orig1", "orig2"]
    with pytest.raises(SystemExit) as info:
        main(["manifest", *args, "-o", f"{out}/manifest.json", "--overwrite"])
    assert info.value.code == 0
    assert "orig0" not in _keys(f"{out}/manifest.json")
