"""A local manifest that is not a regular file (a FIFO, a device, a directory) is refused by
every entry point that loads one, naming its path, and never waited on: a FIFO's ``open()``
waits for a writer forever. Each call runs in a thread; one still waiting after 2 s fails
the test (the FIFO's writer end is then opened and closed, so the thread ends)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.cli import main
from shardkit.errors import ManifestError
from shardkit.format.manifest.compact import build_compact
from shardkit.format.manifest.journal import journal_path, read_journal
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest

pytestmark = pytest.mark.integration


def _in_time(call: Callable[[], Any], fifo: Path) -> BaseException | None:
    """What ``call()`` raised (None: it returned), failing the test if it waits on ``fifo``."""
    pool = ThreadPoolExecutor(1)
    done = pool.submit(call)
    try:
        return done.exception(timeout=2)
    except TimeoutError:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # its read ends: EOF
        pytest.fail(f"{call} waited on the FIFO {fifo}")
    finally:
        pool.shutdown(wait=True)


@pytest.fixture
def fifo(make_shards: Callable[..., Manifest], tmp_path: Path) -> Path:
    make_shards([2, 1], subdir="data")
    path = tmp_path / "data" / "manifest.json"
    path.unlink()
    os.mkfifo(path)
    return path


def test_a_fifo_manifest_is_refused_by_the_python_api(fifo: Path) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: Manifest.load(fifo),
        lambda: load_manifest(str(fifo)),
        lambda: load_manifest(str(fifo.parent)),  # the folder: its manifest.json
        lambda: load_manifest(fifo.as_uri()),
        lambda: sk.verify(fifo),
        lambda: next(iter(sk.ShardDataset(str(fifo)))),
        lambda: build_compact(str(fifo)),
        lambda: sk.IndexedShards(str(fifo)),
    ]
    for call in calls:
        exc = _in_time(call, fifo)
        assert isinstance(exc, ManifestError), (call, exc)
        assert str(fifo) in str(exc) and "it is a FIFO, not a regular file" in str(exc)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_a_fifo_manifest_is_one_line_from_the_cli(
    fifo: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exc = _in_time(lambda: main([command, str(fifo)]), fifo)
    out = capsys.readouterr()
    assert isinstance(exc, SystemExit) and exc.code == 1, (exc, out)
    assert str(fifo) in out.err and "it is a FIFO, not a regular file" in out.err
    assert "Traceback" not in out.err + out.out


def test_a_device_or_a_directory_as_manifest_is_refused_by_name(tmp_path: Path) -> None:
    device = tmp_path / "manifest.json"
    device.symlink_to("/dev/null")  # read, it was an empty manifest: not what it is
    with pytest.raises(ManifestError, match="it is a device, not a regular file") as err:
        Manifest.load(device)
    assert str(device) in str(err.value)
    folder = tmp_path / "m.json"
    folder.mkdir()
    with pytest.raises(ManifestError, match="it is a directory, not a regular file"):
        Manifest.load(folder)


def test_a_fifo_journal_is_refused_by_name(tmp_path: Path) -> None:
    """A build's journal beside its manifest (read on resume) is no FIFO either."""
    manifest = str(tmp_path / "manifest.json")
    journal = Path(journal_path(manifest))
    assert read_journal(manifest) == []  # none: nothing journalled
    os.mkfifo(journal)
    exc = _in_time(lambda: read_journal(manifest), journal)
    assert isinstance(exc, ManifestError) and str(journal) in str(exc)
    assert "it is a FIFO, not a regular file" in str(exc)
