"""Every ```python block of README.md and docs/*.md runs: a snippet that does not run fails.

A page's blocks run in order in one namespace (a page is one story), in a fresh directory
holding small generated data sets the pages name: ``shards/`` (documents: 65 int32 tokens,
a json record and a text field, four shards) and ``web/``, ``code/``, ``math/`` (documents
of varied length, for mixtures). A block whose info string says ``no-run`` (it needs a
cluster, a bucket or a framework's launcher) is only parsed; keep those few.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import shardkit as sk

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.integration


def blocks(page: Path) -> list[tuple[int, str, bool]]:
    """(line, code, runs) of every python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        out.append((line, m.group(2), "no-run" not in m.group(1).split()))
    return out


def make_data(root: Path) -> None:
    """The data sets the pages read."""
    rng = np.random.default_rng(0)
    with sk.ShardWriter(root / "shards", maxcount=60) as w:
        for i in range(240):
            tokens = rng.integers(0, 1000, size=65, dtype=np.int32)
            w.write({"__key__": f"doc-{i:06d}", "tokens.npy": tokens,
                     "json": {"lang": "en", "i": i}, "txt": f"document {i}"})  # fmt: skip
    for k, name in enumerate(("web", "code", "math")):
        with sk.ShardWriter(root / name, maxcount=40) as w:
            for i in range(120 - 30 * k):
                n = int(rng.integers(20, 200))
                tokens = rng.integers(1, 1000, size=n, dtype=np.int32)
                w.write({"__key__": f"{name}-{i:05d}", "tokens.npy": tokens})


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-data")
    make_data(root)
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_code_runs(
    page: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = blocks(page)
    for line, code, _ in found:
        ast.parse(code, filename=f"{page.name}:{line}")  # even a no-run block must parse
    runnable = [(line, code) for line, code, runs in found if runs]
    if not runnable:
        return
    for d in data.iterdir():
        shutil.copytree(d, tmp_path / d.name)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared CI machine
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        for line, code in runnable:
            where = f"{page.relative_to(REPO)}:{line}"
            try:
                exec(compile(code, where, "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{where}: {exc!r}") from exc
    finally:
        torch.set_num_threads(threads)
    assert os.getcwd() == str(tmp_path)


def test_few_blocks_are_exempt() -> None:
    exempt = [(p.name, line) for p in PAGES for line, _, runs in blocks(p) if not runs]
    total = sum(len(blocks(p)) for p in PAGES)
    assert total >= 10 and len(exempt) * 4 <= total, exempt


def test_relative_links_resolve() -> None:
    broken = []
    for page in [*PAGES, REPO / "examples" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []
