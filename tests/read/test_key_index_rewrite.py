"""The key index rewritten or cut in place under a running reader: no SIGBUS (it used to be
memory-mapped), never another table's numbers; the table is opened or built again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_RUN = """
import os, shutil, sys
from shardkit.read.keys import build_key_table
path, other, how = sys.argv[1:4]
keys = [f"k{i:04d}" for i in range(3000)]
built = []
def make():
    built.append(1)
    return keys
t = build_key_table(path, "a" * 32, make)
small = build_key_table(other, "b" * 32, lambda: keys[:5])
assert t.find("k0007") == [7]
if how == "truncate":
    os.truncate(path, 100)
elif how == "cp":
    shutil.copyfile(other, path)  # another data set's smaller table over it: the same inode
else:
    with open(path, "r+b") as f:  # the same bytes written again in place
        data = f.read(); f.seek(0); f.write(data)
print(t.find("k0007"), t.find("k2999"), t.find("nope"), len(built), flush=True)
"""


@pytest.mark.parametrize(("how", "builds"), [("truncate", 2), ("cp", 2), ("same", 1)])
def test_a_key_index_rewritten_under_a_reader(tmp_path: Path, how: str, builds: int) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_RUN),
            str(tmp_path / "a.keys"),
            str(tmp_path / "b.keys"),
            how,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # -7: SIGBUS
    assert out.stdout.split() == ["[7]", "[2999]", "[]", str(builds)]
