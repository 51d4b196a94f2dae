"""Hostile input to ``shardkit state show|diff`` (issue 31): a --pipeline file that raises,
a function that gives no loader, --json on every error (JSON, exit 1), a state holding
credentials in a url (never printed), a garbage torch file (no advice to load it unsafely)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit.cli import main
from tests.cli.test_state_cli import saved as saved_state

SECRET = "s3cret-Tok3n"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A JSON file holding a two-source mixture loader's state after 3 batches."""
    _, js, paths = saved_state(tmp_path_factory.mktemp("state"))
    return js, paths


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI's entry point in this process: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


PIPELINES = {
    "import": "raise RuntimeError('boom at import')\n",
    "call": "def make():\n    raise ValueError('boom in make')\n",
    "syntax": "def make(:\n",
    "nothing": "def make():\n    return 42\n",
}


@pytest.mark.parametrize("kind", sorted(PIPELINES))
@pytest.mark.parametrize("as_json", [False, True])
def test_a_pipeline_file_that_fails_is_one_line_exit_1(
    saved: tuple[Path, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    as_json: bool,
) -> None:
    """Each was a Python traceback (and with --json no JSON)."""
    js, _ = saved
    script = tmp_path / f"{kind}.py"
    script.write_text(PIPELINES[kind], encoding="utf-8")
    flags = ["--json"] if as_json else []
    rc, out, err = run(capsys, "state", "diff", str(js), "--pipeline", f"{script}:make", *flags)
    assert rc == 1
    assert "Traceback" not in out + err
    text = json.loads(out)["error"] if as_json else err
    assert f"{kind}.py" in text and ("make" in text or kind in ("import", "syntax"))


def test_a_missing_pipeline_file_is_a_usage_error(
    saved: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js, _ = saved
    rc, out, err = run(capsys, "state", "diff", str(js), "--pipeline", f"{tmp_path}/no.py:make")
    assert rc == 2 and "no.py" in err and "Traceback" not in out + err


def garbage(tmp_path: Path) -> dict[str, Path]:
    files = {"bad.json": b"{not json", "bad.pt": b"\x00\x01 garbage", "empty.json": b""}
    for name, raw in files.items():
        (tmp_path / name).write_bytes(raw)
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "nokey.pt")
    return {name: tmp_path / name for name in [*files, "nokey.pt"]}


@pytest.mark.parametrize("name", ["bad.json", "bad.pt", "empty.json", "nokey.pt"])
def test_json_errors_are_json_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """--json printed 'error: ...' on stderr and nothing on stdout."""
    path = garbage(tmp_path)[name]
    rc, out, _ = run(capsys, "state", "show", str(path), "--json")
    assert rc == 1
    assert name in json.loads(out)["error"] or "WebLoader state" in json.loads(out)["error"]


def test_a_garbage_torch_file_gets_no_advice_to_load_it_unsafely(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's message told the user to re-run with weights_only=False (arbitrary code)."""
    rc, _, err = run(capsys, "state", "show", str(garbage(tmp_path)["bad.pt"]))
    assert rc == 1 and "bad.pt" in err
    assert "weights_only` set to `False`" not in err and len(err.splitlines()) == 1


def with_credentials(js: Path, tmp_path: Path) -> Path:
    """The state with a source named by a url holding credentials, and a removed one."""
    outer = json.loads(js.read_text(encoding="utf-8"))
    st = outer["data"]
    name = f"https://user:{SECRET}@host/web"
    fp = json.loads(st["pipeline"])
    fp[0]["names"] = [name, "books"]
    st["pipeline"] = json.dumps(fp)
    ranks = json.loads(st["ranks"])
    ranks[0]["workers"][0]["names"] = [name, "books"]
    st["ranks"] = json.dumps(ranks)
    st["retired"] = {f"s3://AKIA:{SECRET}@bucket/k": {"samples": 1, "tokens": 0, "epochs": 0}}
    out = tmp_path / "cred.json"
    out.write_text(json.dumps(outer), encoding="utf-8")
    return out


@pytest.mark.parametrize("as_json", [False, True])
def test_credentials_in_a_state_are_never_printed(
    saved: tuple[Path, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    js, paths = saved
    cred = with_credentials(js, tmp_path)
    script = tmp_path / "good.py"
    one = "ShardDataset({!r}, seed=1).decode()"
    sets = f"[{one.format(paths['a'])}, {one.format(paths['b'])}]"
    script.write_text(
        "from shardkit import ShardDataset, WebLoader, mix\n"
        f"def make():\n    return mix({sets}, weights=[1, 1], names=['web', 'books']).batched(2)\n",
        encoding="utf-8",
    )
    flags = ["--json"] if as_json else []
    texts = []
    for argv in (["show"], ["diff", "--pipeline", f"{script}:make"]):
        _, out, err = run(capsys, "state", argv[0], str(cred), *argv[1:], *flags)
        texts.append(out + err)
        if as_json:
            json.loads(out)
    assert all(SECRET not in t for t in texts), texts
    assert "books" in texts[0]


@pytest.mark.integration
def test_the_installed_command_exits_1_with_json_for_a_failing_pipeline(
    saved: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Through a subprocess, as a user runs it."""
    js, _ = saved
    script = tmp_path / "p.py"
    script.write_text(PIPELINES["call"], encoding="utf-8")
    argv = ["state", "diff", str(js), "--pipeline", f"{script}:make", "--json"]
    code = "import sys; from shardkit.cli import main; main(sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    got: dict[str, Any] = json.loads(done.stdout)
    assert "boom in make" in got["error"] and "Traceback" not in done.stderr
