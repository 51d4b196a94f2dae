"""``shardkit build`` into a disk that fills up: a WriterError, and only whole shards listed.

The disk is real: a 1 MiB tmpfs the test mounts (CI runs as root). Where mounting is not
allowed, the same build runs under a file-size limit (``RLIMIT_FSIZE``), which fails a
write with ``EFBIG`` as a full disk fails it with ``ENOSPC``: no mock either way.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from shardkit.format.manifest.model import Manifest
from tests.helpers.readback import assert_whole, write_jsonl

pytestmark = pytest.mark.integration

_DISK = 1 << 20


@pytest.fixture(params=["tmpfs", "fsize"])
def small_disk(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, Callable[[], None] | None]]:
    """``(directory, preexec)``: a 1 MiB tmpfs, or a plain directory and a file-size limit
    (also where mounting is not allowed). A file-size limit also makes a write take only a
    part of its bytes, which the writer must not mistake for the whole."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={_DISK}", "tmpfs", str(mnt)],
            capture_output=True,
            check=False,
        )
        if request.param == "tmpfs"
        else None
    )
    if r is not None and r.returncode == 0:
        try:
            yield mnt, None
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        return

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (_DISK // 32, _DISK // 32))  # < a shard

    yield mnt, limit


def _corpus(root: Path) -> Path:
    """About 5 MB of JSONL that compresses to about half: more than the disk holds."""
    rng = np.random.default_rng(3)
    recs = ({"id": f"r{i:05d}", "text": rng.bytes(600).hex()} for i in range(4000))
    return write_jsonl(root / "corpus.jsonl", recs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compress", [[], ["--compress", "zstd"]], ids=["tar", "zstd"])
def test_build_into_a_full_disk(
    tmp_path: Path, small_disk: tuple[Path, Callable[[], None] | None], compress: list[str]
) -> None:
    disk, preexec = small_disk
    src = _corpus(tmp_path / "src")
    out = disk / "out"
    argv = ["build", str(src), "-o", str(out), "--maxsize", "200KB", *compress]
    proc = subprocess.run(
        [sys.executable, "-m", "shardkit", *argv],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        preexec_fn=preexec,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "No space left on device" in lines[0] or "File too large" in lines[0], lines[0]
    assert str(out) in lines[0]
    # what is listed is whole (size, checksum, samples); no partial shard or temp file
    manifest = out / "manifest.json"
    listed: set[str] = set()
    if manifest.exists():
        m: Manifest = assert_whole(manifest)
        listed = {s.url for s in m.shards}
        assert m.shards or preexec is not None, "on a tmpfs some shards fit before it filled"
    left = {p.name for p in out.iterdir()} if out.exists() else set()
    assert not {n for n in left if ".tmp" in n}, left
    with contextlib.suppress(FileNotFoundError):
        os.remove(manifest)
    shards = {n for n in left if n.endswith((".tar", ".tar.zst"))}
    assert shards <= listed, shards - listed
