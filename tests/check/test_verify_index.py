"""Plain ``verify`` (no ``--deep``) checks each shard's sample index file: there, the one
the manifest vouches for (``index_checksum``), of the shard's count and bound to it, as a
lookup will check it; through the CLI and ``sk.verify``, on local files and over HTTP,
and against hostile indexes (a link out of the base, a huge file, a dropped connection)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import shardkit as sk
from shardkit import Manifest
from shardkit.check.report import VerifyReport
from shardkit.cli import cli
from shardkit.format.layout import index_name
from shardkit.format.tario.index import index_size
from shardkit.io import IoConfig, RetryPolicy, UncachedOpener
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

SHARD = "data-000000.tar"
INDEX = index_name(SHARD)


@pytest.fixture
def shards(make_shards: Callable[..., Manifest], tmp_path: Path) -> Path:
    make_shards([4, 3], subdir="set")
    return tmp_path / "set" / "manifest.json"


def _cli(target: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """``shardkit verify TARGET ARGS``: its exit code, its --json report and its text."""
    runner = CliRunner()
    as_json = runner.invoke(cli, ["verify", target, *args, "--json"], catch_exceptions=False)
    text = runner.invoke(cli, ["verify", target, *args], catch_exceptions=False)
    assert as_json.exit_code == text.exit_code
    return as_json.exit_code, json.loads(as_json.stdout), text.stdout


def _index_problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["problems"] if p["kind"] == "index"]


def _entry(manifest: Path, i: int = 0) -> sk.ShardEntry:
    return Manifest.load(manifest).shards[i]


def _edit(manifest: Path, i: int, **changes: Any) -> None:
    m = Manifest.load(manifest)
    m.shards[i] = replace(m.shards[i], **changes)
    m.save(manifest)


def test_a_good_index_passes_and_a_missing_one_is_a_problem(shards: Path) -> None:
    assert _cli(str(shards))[0] == 0
    want = _entry(shards).index_checksum
    (shards.parent / INDEX).unlink()
    code, report, text = _cli(str(shards))
    assert code == 1 and not report["ok"] and report["bad_shards"] == [SHARD]
    (p,) = report["problems"]
    assert (p["url"], p["kind"], p["expected"], p["found"]) == (SHARD, "index", want, "missing")
    assert INDEX in p["message"] and "missing" in p["message"]
    assert f"FAIL {SHARD}: index: sample index {INDEX} is missing" in text
    assert f"(expected {want}, found missing)" in text
    api = sk.verify(shards)  # the Python API: the same problem
    assert not api.ok and [(q.url, q.kind, q.found) for q in api.problems] == [
        (SHARD, "index", "missing")
    ]
    quick = _cli(str(shards), "--quick")  # quick checks shard sizes only
    assert quick[0] == 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "longer"])
def test_a_different_index_names_want_and_got(shards: Path, damage: str) -> None:
    path = shards.parent / INDEX
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-8]
    elif damage == "flip":
        data[60] ^= 1
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"\0" * 8  # past any index of 4 samples: not read past that
    path.write_bytes(bytes(data))
    want = _entry(shards).index_checksum
    code, report, text = _cli(str(shards))
    assert code == 1
    (p,) = _index_problems(report)
    assert p["url"] == SHARD and p["expected"] == want and p["found"] != want
    assert INDEX in p["message"] and f"FAIL {SHARD}: index: sample index {INDEX}" in text
    if damage == "longer":
        limit = index_size(3, 4)
        assert p["found"] == f"> {limit} bytes" and "larger than an index of 4" in p["message"]
        return
    assert str(p["found"]).startswith("sha256:")
    assert f"({len(data)} bytes) differs from the manifest's index_checksum" in p["message"]
    assert sk.verify(shards, jobs=2).problems[0].found == p["found"]


def test_an_index_not_vouched_for_is_still_read_and_checked(shards: Path) -> None:
    """Without ``index_checksum`` a lookup reads the index by ranges and still refuses one
    of another count or shard: plain verify says so."""
    _edit(shards, 0, index_checksum=None)
    assert _cli(str(shards))[0] == 0
    path = shards.parent / INDEX
    path.write_bytes((shards.parent / index_name("data-000001.tar")).read_bytes())
    (p,) = _index_problems(_cli(str(shards))[1])
    assert (p["expected"], p["found"]) == (4, 3) and "different count" in p["message"]
    _edit(shards, 0, nsamples=3)  # now the count agrees, but it is shard 1's index
    (p,) = _index_problems(_cli(str(shards))[1])
    assert "belongs to another shard" in p["message"]
    path.write_bytes(b"garbage!" * 4)
    (p,) = _index_problems(_cli(str(shards))[1])
    assert "not a shardkit sample index" in p["message"]


def test_over_http(shards: Path) -> None:
    with RangeServer(shards.parent) as server:
        url = server.url("manifest.json")
        assert _cli(url)[0] == 0
        assert server.requests("*.idx"), "plain verify reads the sample index over HTTP"
        want = _entry(shards, 1).index_checksum
        (shards.parent / index_name("data-000001.tar")).unlink()
        path = shards.parent / INDEX
        path.write_bytes(path.read_bytes()[:-1])
        code, report, text = _cli(url)
        assert code == 1 and report["bad_shards"] == [SHARD, "data-000001.tar"]
        bad, gone = _index_problems(report)
        assert bad["expected"] == _entry(shards).index_checksum and bad["found"] != bad["expected"]
        assert (gone["url"], gone["found"]) == ("data-000001.tar", "missing")
        assert gone["expected"] == want
        assert "FAIL data-000001.tar: index: sample index" in text
        assert not sk.verify(url).ok


def test_a_connection_dropped_mid_index(shards: Path) -> None:
    """Dropped: the read resumes and the whole index passes; a server that keeps failing:
    a problem naming the index, never a hang."""
    with RangeServer(shards.parent) as server:
        url = server.url("manifest.json")
        server.add_fault(f"*{INDEX}", "drop", after=50)
        assert sk.verify(url).ok
        assert len(server.requests(f"*{INDEX}")) == 2  # dropped, then resumed
        policy = RetryPolicy(max_attempts=2, backoff_base=0.01, backoff_max=0.02)
        opener = UncachedOpener(IoConfig(retry=policy))
        server.add_fault(f"*{INDEX}", "status", status=503, times=100)
        report = sk.verify(url, opener=opener)
        (p,) = report.problems
        assert (p.url, p.kind) == (SHARD, "index") and INDEX in p.message and "503" in p.message


def test_a_linked_index_out_of_the_base_is_refused(shards: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.idx"
    path = shards.parent / INDEX
    outside.write_bytes(path.read_bytes())  # the right bytes, but outside the data set
    path.unlink()
    os.symlink(outside, path)
    code, report, _ = _cli(str(shards))
    assert code == 1
    (p,) = _index_problems(report)
    assert p["url"] == SHARD and "outside the manifest's base" in p["message"]
    assert str(tmp_path / "set") in p["message"]


def test_an_index_url_leaving_the_base_is_refused(shards: Path, tmp_path: Path) -> None:
    (tmp_path / "x.idx").write_bytes((shards.parent / INDEX).read_bytes())
    _edit(shards, 0, index="../x.idx")
    for args in ((), ("--deep",)):
        code, report, _ = _cli(str(shards), *args)
        assert code == 1
        (p,) = _index_problems(report)
        assert "refusing url '../x.idx'" in p["message"]


def test_a_huge_index_is_refused_unread(shards: Path) -> None:
    """A file far past any index of the shard's count is named, and no more of it read than
    an index of that count can hold (plain and deep, local and HTTP)."""
    path = shards.parent / INDEX
    with open(path, "ab") as f:
        f.truncate(64 << 20)
    limit = index_size(3, 4)
    with RangeServer(shards.parent) as server:
        for target in (str(shards), server.url("manifest.json")):
            for args in ((), ("--deep",)):
                code, report, _ = _cli(target, *args)
                assert code == 1
                (p,) = _index_problems(report)
                assert f"larger than an index of 4 samples can be ({limit} bytes)" in p["message"]
        assert 0 < server.bytes_sent(f"*{INDEX}") <= 4 * (limit + 1)


def _verify_in_time(manifest: Path, level: str, unblock: Path) -> VerifyReport:
    """``sk.verify`` in a thread: a read that waits on a FIFO fails the test in 5 s (its
    writer end is then opened, so the thread ends) instead of hanging it."""
    out: list[VerifyReport] = []
    worker = threading.Thread(target=lambda: out.append(sk.verify(manifest, level=level)))
    worker.start()
    worker.join(5)
    if worker.is_alive():
        os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail(f"verify waited on the FIFO {unblock}")
    return out[0]


def test_a_fifo_is_a_problem_not_a_hang(shards: Path) -> None:
    """A FIFO where an index (or a shard) should be: its open would wait for a writer."""
    index = shards.parent / INDEX
    index.unlink()
    os.mkfifo(index)
    (p,) = _verify_in_time(shards, "checksum", index).problems
    assert (p.url, p.kind) == (SHARD, "index") and "a FIFO, not a regular file" in p.message
    shard = shards.parent / "data-000001.tar"
    shard.unlink()
    os.mkfifo(shard)
    problems = _verify_in_time(shards, "quick", shard).problems
    assert [(p.url, p.kind) for p in problems] == [("data-000001.tar", "unreadable")]
    assert "a FIFO, not a regular file" in problems[0].message
