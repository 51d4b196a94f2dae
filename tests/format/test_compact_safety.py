"""A compact form is checked whole and stays safe when replaced under a job (issue 19,
findings 4, 5, 9): a flipped bit in its header, a manifest rewritten in place with the same
size and mtime, a header that is not JSON, a form cut or copied over while a loader with
workers reads (3,000 shards: the old mapped form died of SIGBUS or gave 0 samples), and no
room to write a form (a real full tmpfs; the read goes on with the form in memory)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardkit import ShardDataset, WebLoader
from shardkit.cache import opener_for
from shardkit.format.manifest.compact import compact_path
from shardkit.format.manifest.compact_file import PRELUDE
from shardkit.format.manifest.model import Manifest
from shardkit.io.config import CacheConfig, IoConfig
from tests.helpers.data import make_shards as write_shards
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

MakeShards = Callable[..., Manifest]


def _keys(source: str, *, workers: int = 2, io: IoConfig | None = None) -> list[tuple[str, bytes]]:
    """Every (key, tokens) a loader with workers hands out, in manifest order per worker."""
    ds = ShardDataset(source, shardshuffle=False, io=io).to_tuple("__key__", "tokens.npy")
    context = "fork" if workers else None
    loader = WebLoader(ds, num_workers=workers, multiprocessing_context=context)
    return sorted((str(k), bytes(v)) for k, v in loader)


def _truth(m: Manifest) -> list[tuple[str, bytes]]:
    ds = ShardDataset(m, shardshuffle=False).to_tuple("__key__", "tokens.npy")
    return sorted((str(k), bytes(v)) for k, v in ds)


def _header(path: str) -> tuple[bytearray, int, int]:
    raw = bytearray(Path(path).read_bytes())
    n = int.from_bytes(raw[8:16], "little")
    return raw, PRELUDE, PRELUDE + n


def test_a_flipped_bit_in_the_header_is_found_and_the_form_rebuilt(
    make_shards: MakeShards,
) -> None:
    m = make_shards([4, 4, 4, 4], subdir="d")
    path = str(Path(str(m.base)) / "manifest.json")
    want = _truth(m)
    assert _keys(path) == want
    raw, lo, hi = _header(compact_path(path))
    at = raw.index(b'"start": 0', raw.index(b'"urls": {', lo, hi), hi) + len(b'"start": ')
    raw[at] ^= 0x01  # "0" -> "1": every shard read from the next file
    Path(compact_path(path)).write_bytes(bytes(raw))
    assert _keys(path) == want
    assert b'"start": 0' in Path(compact_path(path)).read_bytes()  # rebuilt


def test_a_manifest_rewritten_in_place_with_its_size_and_mtime_is_seen(
    make_shards: MakeShards,
) -> None:
    m = make_shards([2, 3, 4], subdir="d")
    path = Path(str(m.base)) / "manifest.json"
    assert len(_keys(str(path), workers=0)) == 9
    before = path.stat()
    text = Manifest(shards=m.shards[:1]).dumps()  # the first shard only, padded to the size
    text += " " * (before.st_size - len(text.encode()))
    with open(path, "r+") as f:  # in place: the same inode, size and (set back) mtime
        f.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert len(_keys(str(path), workers=0)) == 2
    assert len(_keys(str(path))) == 2  # in the workers too


def _with_header(path: str, text: bytes) -> None:
    """The form at ``path`` with ``text`` as its header, its checksum made to match."""
    raw, lo, hi = _header(path)
    text = text.ljust(hi - lo)
    raw[lo:hi] = text
    raw[16:PRELUDE] = hashlib.sha256(text).digest()
    Path(path).write_bytes(bytes(raw))


def test_a_header_that_is_not_json_is_rebuilt(make_shards: MakeShards) -> None:
    m = make_shards([3, 4], subdir="d")
    path = str(Path(str(m.base)) / "manifest.json")
    want = _truth(m)
    _with_header(compact_path(path), b"{not json")
    assert _keys(path) == want
    _with_header(compact_path(path), b"\xff\xfe")  # nor text
    assert _keys(path) == want


_RUN = """
import os, shutil, sys
from shardkit import ShardDataset, WebLoader
from shardkit.cache import make_opener
path, other, how = sys.argv[1:4]
cols = path + ".cols"
ds = ShardDataset(path, shardshuffle=False).to_tuple("__key__", "tokens.npy")
loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork", persistent_workers=True)
for epoch in range(2):
    loader.set_epoch(epoch)
    seen = []
    for i, (key, tokens) in enumerate(loader):
        seen.append((str(key), bytes(tokens).hex()))
        if epoch == 0 and i == 10:
            if how == "truncate":
                os.truncate(cols, 100)
            else:
                shutil.copyfile(other + ".cols", cols)  # cp over it: the same inode
    print(epoch, len(seen), len(set(seen)), hash(tuple(sorted(seen))), flush=True)
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """3,000 one-sample shards (a form of ~300 KB) and another, small data set (left to
    pytest's clean-up of its temporary folders: removing its 9,000 files took 5.7 s)."""
    root = tmp_path_factory.mktemp("many")
    write_shards(root / "big", [1] * 3000, tokens=4)
    write_shards(root / "small", [2, 2], tokens=4, seed=9)
    return str(root / "big" / "manifest.json"), str(root / "small" / "manifest.json")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["truncate", "cp"])
def test_a_form_cut_or_copied_over_under_a_running_loader(many: tuple[str, str], how: str) -> None:
    big, small = many
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN), big, small, how],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])  # -7: SIGBUS
    epochs = [line.split() for line in out.stdout.splitlines()]
    assert [e[:3] for e in epochs] == [["0", "3000", "3000"], ["1", "3000", "3000"]]
    assert epochs[0][3] == epochs[1][3]  # the same samples in both epochs
    shutil.rmtree(Path(big).parent / "unused", ignore_errors=True)


# -- no room to write a form ---------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs of 2 MiB (CI runs as root), to be filled by the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to the last byte."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def _warned(caplog: pytest.LogCaptureFixture) -> bool:
    return any("keeping it in memory" in r.getMessage() for r in caplog.records)


def test_no_room_for_a_local_form_keeps_it_in_memory_and_reads_on(
    full_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = write_shards(full_disk / "d", [3, 4, 5], tokens=16)
    want = _truth(m)
    path = full_disk / "d" / "manifest.json"
    os.unlink(compact_path(str(path)))
    _fill(full_disk)
    caplog.set_level(logging.WARNING, logger="shardkit")
    ds = ShardDataset(str(path), shardshuffle=False).to_tuple("__key__", "tokens.npy")
    loader = WebLoader(ds, num_workers=2, multiprocessing_context="fork")
    assert sorted((str(k), bytes(v)) for k, v in loader) == want
    assert _warned(caplog) and not os.path.exists(compact_path(str(path)))
    assert ds.io_stats().get("compact_forms_in_memory") == 1


def test_no_room_for_a_remote_form_or_the_nodes_copy_reads_on(
    make_shards: MakeShards,
    full_disk: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = make_shards([3, 4, 5], subdir="d", tokens=16)
    want = _truth(m)
    monkeypatch.setenv("XDG_CACHE_HOME", str(full_disk / "user"))
    with RangeServer(str(m.base)) as srv:
        url = srv.url("manifest.json")
        node = opener_for(IoConfig(cache=CacheConfig(cache_dir=full_disk / "node", manifest_ttl=0)))
        assert Manifest.loads(node.fetch_manifest(url)).total_samples == 12
        _fill(full_disk)
        caplog.set_level(logging.WARNING, logger="shardkit")
        assert _keys(url) == want  # the form in the user's cache dir: no room
        assert _warned(caplog)
        # the manifest changed on the server; the node's new copy has no room
        Manifest(shards=m.shards[:2]).save(str(Path(str(m.base)) / "manifest.json"))
        assert Manifest.loads(node.fetch_manifest(url)).total_samples == 7
        assert node.stats().get("manifest_copies_not_written") == 1
