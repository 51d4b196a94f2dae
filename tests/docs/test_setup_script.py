"""scripts/setup.sh's stamp: which profile is installed, from which pyproject.toml and script.

The demo installs the runtime only; the tests' command must then add the dev extras, and a
dev venv serves the demo as it is. ``setup.sh PROFILE --check`` answers without installing.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")  # a venv where shardkit imports
    python.chmod(0o755)
    return tmp_path


def _stamp(checkout: Path, profile: str, *, stale: bool = False) -> None:
    want = hashlib.sha256(
        (checkout / "pyproject.toml").read_bytes() + (checkout / "scripts/setup.sh").read_bytes()
    ).hexdigest()
    digest = "0" * 64 if stale else want
    (checkout / ".venv" / ".shardkit-setup").write_text(f"{profile} {digest}\n")


def _installed(checkout: Path, profile: str) -> bool:
    r = subprocess.run(["bash", "scripts/setup.sh", profile, "--check"], cwd=checkout,
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    return r.returncode == 0


def test_a_runtime_venv_serves_the_demo_and_is_upgraded_for_the_tests(checkout: Path) -> None:
    assert not _installed(checkout, "runtime") and not _installed(checkout, "dev")  # no stamp
    _stamp(checkout, "runtime")
    assert _installed(checkout, "runtime")
    assert not _installed(checkout, "dev")  # test.sh after demo.sh installs the dev extras
    _stamp(checkout, "dev")
    assert _installed(checkout, "runtime") and _installed(checkout, "dev")
    _stamp(checkout, "dev", stale=True)  # another pyproject.toml or script: install again
    assert not _installed(checkout, "runtime") and not _installed(checkout, "dev")


def test_a_venv_where_shardkit_does_not_import_is_installed_again(checkout: Path) -> None:
    _stamp(checkout, "dev")
    (checkout / ".venv" / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    assert not _installed(checkout, "dev")
