"""Hostile shards through every entry point: a named error, one CLI line, bounded memory.

read_shard, verify --deep, inspect, manifest from-shards, build and ShardDataset + WebLoader
with workers each meet the same broken shards; every one must answer with a shardkit error
that names the shard (and the byte offset where the reader knows it), exit 1 from the CLI
with one line and no traceback, and never hold a member it only measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit import ShardDataset, ShardFormatError, ShardkitError, WebLoader, read_shard
from shardkit.cache import make_opener
from shardkit.check.verify import verify
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest
from tests.helpers import hostile
from tests.helpers.hostile import EOA, member, one_shard_set, pax, pax_record, run_cli_measured
from tests.helpers.readback import shardkit

pytestmark = pytest.mark.integration

_LEAD = hostile.good(2)
# name -> (tar bytes, byte offset the reader names, message fragment)
BROKEN = {
    "pax-size-superscript": (
        _LEAD + pax(pax_record("size", "\u00b2")) + member("a.txt", b"a") + EOA,
        len(_LEAD),
        "pax size",
    ),
    "unknown-type": (_LEAD + hostile.header("q.txt", typeflag=b"Q") + EOA, len(_LEAD), "type 'Q'"),
    "zero-block-then-data": (_LEAD + b"\0" * 512 + b"j" * 512, len(_LEAD), "one zero block"),
}
IDS = sorted(BROKEN)


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], err


@pytest.fixture(params=IDS)
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, int, str]:
    data, offset, match = BROKEN[request.param]
    return one_shard_set(tmp_path / "set", "data-000000.tar", data, nsamples=3), offset, match


@pytest.mark.timeout(30)
def test_read_shard(broken: tuple[Path, int, str]) -> None:
    manifest, offset, match = broken
    shard = manifest.parent / "data-000000.tar"
    with pytest.raises(ShardFormatError, match=match) as info:
        list(read_shard(shard))
    assert info.value.url == str(shard) and info.value.offset == offset


@pytest.mark.timeout(30)
def test_verify_deep(broken: tuple[Path, int, str]) -> None:
    manifest, offset, match = broken
    report = verify(load_manifest(str(manifest)), level="deep", opener=make_opener())
    assert [(p.kind, p.offset) for p in report.problems] == [("format", offset)]
    assert match in report.problems[0].message
    r = shardkit("verify", manifest, "--deep")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"byte {offset}" in r.stdout + r.stderr


@pytest.mark.timeout(60)
def test_inspect_from_shards_and_build(broken: tuple[Path, int, str], tmp_path: Path) -> None:
    manifest, offset, match = broken
    shard = manifest.parent / "data-000000.tar"
    for args in (
        ("inspect", shard),
        ("manifest", "from-shards", manifest.parent, "-o", tmp_path / "m2.json"),
        ("build", manifest.parent, "-o", tmp_path / "out"),
    ):
        code, err, _ = run_cli_measured(*args)
        _one_line_error(code, err, "data-000000.tar", f"byte {offset}", match)


@pytest.mark.timeout(90)
def test_dataset_with_workers(broken: tuple[Path, int, str]) -> None:
    manifest, offset, match = broken
    loader = WebLoader(
        ShardDataset(str(manifest), shardshuffle=False),
        num_workers=2,
        multiprocessing_context="fork",
    )
    with pytest.raises(ShardFormatError, match=match) as info:
        list(loader)
    assert "data-000000.tar" in str(info.value) and f"byte {offset}" in str(info.value)


# -- a zstd bomb: 65 KB on disk, one 2 GiB member ----------------------------------------
_BOMB = 2 << 30
_SMALL = 700 << 20  # far below the 2 GiB member, far above an interpreter with torch


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bomb") / "set"
    d.mkdir()
    hostile.zstd_bomb(d / "bomb.tar.zst", _BOMB)
    return one_shard_set(d, "bomb.tar.zst", (d / "bomb.tar.zst").read_bytes())


@pytest.mark.timeout(120)
def test_bomb_is_refused_by_readers_before_it_is_read(bomb: Path, tmp_path: Path) -> None:
    code, err, peak = hostile.run_measured(
        "from shardkit import read_shard\n"
        f"list(read_shard({str(bomb.parent / 'bomb.tar.zst')!r}))\n"
    )
    assert code == 1 and "ShardFormatError" in err and "largest-member limit" in err, err
    assert peak < _SMALL, peak
    code, err, peak = run_cli_measured("build", bomb.parent, "-o", tmp_path / "out")
    _one_line_error(code, err, "bomb.tar.zst", "byte 0", "largest-member limit")
    assert peak < _SMALL, peak
    code, err, peak = hostile.run_measured(
        "from shardkit import ShardDataset, WebLoader\n"
        f"ds = ShardDataset({str(bomb)!r})\n"
        "list(WebLoader(ds, num_workers=2, multiprocessing_context='fork'))\n"
    )
    assert code == 1 and "largest-member limit" in err and "bomb.tar.zst" in err, err
    assert peak < _SMALL, peak


@pytest.mark.timeout(180)
def test_bomb_is_measured_not_held(bomb: Path) -> None:
    """inspect, from-shards and verify --deep only need sizes: they read it all, keep none."""
    code, out, peak = run_cli_measured("inspect", bomb.parent / "bomb.tar.zst", "--json")
    assert code == 0, out
    assert peak < _SMALL, peak
    code, out, peak = run_cli_measured(
        "manifest", "from-shards", bomb.parent, "-o", bomb.parent / "m.json"
    )
    assert code == 0, out
    assert peak < _SMALL, peak
    assert json.loads((bomb.parent / "m.json").read_text())["total_samples"] == 1
    code, out, peak = run_cli_measured("verify", bomb, "--deep")
    assert code == 0, out
    assert peak < _SMALL, peak


@pytest.mark.timeout(120)
def test_a_large_member_is_held_once(tmp_path: Path) -> None:
    """Past the limit on purpose: a 600 MiB member costs 600 MiB, not a second copy."""
    size = 600 << 20
    hostile.zstd_bomb(tmp_path / "big.tar.zst", size)
    code, err, peak = hostile.run_measured(
        "from shardkit import read_shard\n"
        f"s = next(iter(read_shard({str(tmp_path / 'big.tar.zst')!r}, max_member=1 << 40)))\n"
        f"assert len(s['bin']) == {size}\n"
    )
    assert code == 0, err
    assert size < peak < size * 1.35, peak


# -- malformed manifests --------------------------------------------------------------------
def _manifest_doc(*entries: dict[str, object]) -> dict[str, object]:
    return {"format": "shardkit.manifest", "version": 1, "shards": list(entries)}


def _entry(url: str, nsamples: object = 2) -> dict[str, object]:
    return {"url": url, "size": 10, "nsamples": nsamples, "checksum": "sha256:" + "0" * 64}


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (
            "manifest.csv",
            "url,size,nsamples,checksum\ndata-000000.tar,10,\u00b2,sha256:" + "0" * 64 + "\n",
            "line 2",
        ),
        (
            "manifest.csv",
            "url,size,nsamples,checksum\ndata-000000.tar,10,\u0662,sha256:" + "0" * 64 + "\n",
            "line 2",
        ),
        (
            "manifest.json",
            json.dumps(_manifest_doc(_entry("a.tar"), _entry("b.tar", 7))).replace(
                '"nsamples": 7', '"nsamples": ' + "9" * 5000
            ),
            "entry 1, field 'nsamples'",
        ),
        (
            "manifest.json",
            json.dumps(_manifest_doc(_entry("a.tar"))).replace(
                '"version": 1', '"version": ' + "1" * 5000
            ),
            "field 'version'",
        ),
        (
            "manifest.json",
            json.dumps(_manifest_doc(_entry("data-000000.tar"), _entry("./data-000000.tar"))),
            "entry 1, field 'url'",
        ),
        (
            "manifest.json",
            json.dumps(_manifest_doc(_entry("d/data-0.tar"), _entry("d/x/../data-0.tar"))),
            "listed twice",
        ),
        (
            "manifest.csv",
            "url,size,nsamples,checksum\n"
            + "".join(f"{u},10,2,sha256:{'0' * 64}\n" for u in ("a.tar", "./a.tar")),
            "line 3",
        ),
    ],
)
@pytest.mark.timeout(30)
def test_malformed_manifest_is_one_named_line(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, err, _ = run_cli_measured("inspect", path)
    _one_line_error(code, err, str(path), where)
    assert len(err) < 400, err  # a 5,000-digit number is not echoed back


# -- a symbolic link out of the manifest's base -------------------------------------------
@pytest.fixture(params=["shard", "directory", "index"])
def escaping(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A good data set, then one shard (or its directory, or its index) swapped for a link
    to a copy outside the base: same bytes, so only the real path can tell."""
    from tests.helpers.data import make_shards

    outside = tmp_path / "outside"
    outside.mkdir()
    base = tmp_path / "set"
    m = make_shards(base / "sub", [3, 3])
    doc = json.loads((base / "sub" / "manifest.json").read_text())
    for e in doc["shards"]:
        e["url"] = "sub/" + e["url"]
        e["index"] = "sub/" + e["index"]
    (base / "manifest.json").write_text(json.dumps(doc))
    name = m.shards[1].url if request.param != "index" else str(m.shards[1].index)
    if request.param == "directory":
        (base / "sub").rename(outside / "sub")
        (base / "sub").symlink_to(outside / "sub")
    else:
        (outside / name).parent.mkdir(parents=True, exist_ok=True)  # an index's .index/
        (base / "sub" / name).rename(outside / name)
        (base / "sub" / name).symlink_to(outside / name)
    return base / "manifest.json"


@pytest.mark.timeout(90)
def test_symlink_out_of_the_base_is_refused(escaping: Path) -> None:
    manifest = load_manifest(str(escaping))
    report = verify(manifest, level="deep", opener=make_opener())
    assert report.problems and {p.kind for p in report.problems} <= {"url", "index"}
    assert "outside the manifest's base" in report.problems[0].message
    r = shardkit("verify", escaping, "--deep")
    assert r.returncode == 1 and "outside the manifest's base" in r.stdout + r.stderr
    with pytest.raises(ShardkitError, match="outside the manifest's base"):
        for rank in range(4):  # shares of one sample: ranged reads that need the index
            ds = ShardDataset(str(escaping), shardshuffle=False)
            ds = ds.split_by_node(rank=rank, world_size=4)
            list(WebLoader(ds, num_workers=2, multiprocessing_context="fork"))


@pytest.mark.timeout(60)
def test_symlink_out_of_the_base_in_inspect_and_from_shards(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    base = tmp_path / "set"
    m = hostile_free_set(outside)
    base.mkdir()
    for s in m.shards:
        (base / s.url).symlink_to(outside / s.url)
    (base / "manifest.json").write_text((outside / "manifest.json").read_text())
    code, err, _ = run_cli_measured("inspect", base / "manifest.json")
    _one_line_error(code, err, "outside the manifest's base", s.url[:-5])
    code, err, _ = run_cli_measured("manifest", "from-shards", base, "-o", base / "m2.json")
    _one_line_error(code, err, "outside", "readers would refuse it")


def hostile_free_set(directory: Path) -> Manifest:
    from tests.helpers.data import make_shards

    return make_shards(directory, [2])


# -- a bug in a decode handler is not bad data ------------------------------------------------
def _buggy_callable(field: str, data: bytes) -> object:
    if field == "json":
        return {"text": data.decode()}["missing"]  # a KeyError: a bug, not bad bytes
    return None


def _strict_callable(field: str, data: bytes) -> object:
    if field == "json" and b"document 1" in data:
        raise ValueError("bad record")  # this is how a handler says "bad bytes"
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("handler", ["warn", "skip_shard"])
def test_a_bug_in_a_decode_handler_propagates(tmp_path: Path, handler: str) -> None:
    from tests.helpers.data import make_shards

    m = make_shards(tmp_path / "set", [4, 4])
    path = str(tmp_path / "set" / "manifest.json")
    for buggy in (_buggy_callable, {"json": lambda data: data.no_such_method()}):
        ds = ShardDataset(path, shardshuffle=False, handler=handler).decode(buggy)
        with pytest.raises((KeyError, AttributeError)):
            list(WebLoader(ds, num_workers=2, multiprocessing_context="fork"))
    ds = ShardDataset(path, shardshuffle=False, handler=handler).decode(_strict_callable)
    keys = [s["__key__"] for s in ds]
    assert "sample-00000001" not in keys and len(keys) == (7 if handler == "warn" else 5)
    assert ds.counters()["skipped_samples"] == 8 - len(keys)
    assert m.total_samples == 8


@pytest.mark.timeout(60)
def test_a_corrupt_image_is_bad_data(tmp_path: Path) -> None:
    from shardkit.write.writer import ShardWriter

    with ShardWriter(tmp_path / "img") as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "png": b"\x89PNG\r\n\x1a\n" + b"junk" * i, "cls": i})
    ds = ShardDataset(str(tmp_path / "img" / "manifest.json"), handler="warn").decode("rgb8")
    assert list(ds) == []
    assert ds.counters()["skipped_samples"] == 3
