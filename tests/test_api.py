"""The public surface is a promise: the root and a few public submodules, their ``__all__``
pinned here name for name; everything else is private and may change. Examples and docs use
only these names (tests/docs runs the docs' code; this file checks their imports)."""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
import re
import types
from collections.abc import Callable
from pathlib import Path

import pytest

import shardkit
from shardkit import errors

REPO = Path(__file__).resolve().parent.parent

# the promise: change a line here only with a note in the changelog of the release
PUBLIC: dict[str, list[str]] = {
    "shardkit": [
        "CacheError",
        "ChecksumError",
        "ConfigError",
        "DecodeError",
        "FetchError",
        "IndexedShards",
        "IoConfig",
        "Manifest",
        "ManifestError",
        "Schedule",
        "ShardDataset",
        "ShardEntry",
        "ShardError",
        "ShardFormatError",
        "ShardWriter",
        "ShardkitError",
        "StateDictError",
        "TransferError",
        "WebLoader",
        "WriterError",
        "__version__",
        "build",
        "end_process_group",
        "mix",
        "read_shard",
        "to_device",
        "verify",
    ],
    "shardkit.io": [
        "CacheConfig",
        "IoConfig",
        "Opener",
        "ReaderLimits",
        "RetryPolicy",
        "UncachedOpener",
        "load_manifest",
        "manifest_source",
        "open_local",
    ],
    "shardkit.metrics": [
        "IdleAlert",
        "LoaderStats",
        "WINDOW_KEYS",
        "counter_delta",
        "job_summary",
        "tracker",
        "watch_idle",
    ],
    "shardkit.metrics.export": [
        "Metric",
        "metrics",
        "prometheus_text",
        "serve_prometheus",
        "tensorboard",
        "write_prometheus",
    ],
    "shardkit.ray": ["ShardDatasink"],
    "shardkit.stages": [
        "POLICIES",
        "Batched",
        "Context",
        "Cursor",
        "Decode",
        "Grid",
        "Map",
        "PackTokens",
        "Select",
        "ShardSource",
        "Stage",
        "ToTuple",
        "attention_cost",
        "check_policy",
        "check_state",
        "collate_numpy",
        "sources_of",
        "state_epoch",
    ],
}
CONSTANTS = {"__version__", "POLICIES", "WINDOW_KEYS"}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_modules_export_exactly_the_promised_names(module: str) -> None:
    mod = importlib.import_module(module)
    assert list(mod.__all__) == PUBLIC[module], f"{module}.__all__ changed"
    for name in mod.__all__:
        obj = getattr(mod, name)
        if name not in CONSTANTS:
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"


def _shardkit_imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) for every shardkit import in ``code`` (name None: ``import m``)."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardkit"):
            out += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("shardkit")]
    return out


def _user_code() -> list[tuple[str, str]]:
    """(where, code) of every example script and every python block of README and docs."""
    found = [(str(p.relative_to(REPO)), p.read_text()) for p in sorted(REPO.glob("examples/*.py"))]
    block = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
    for page in [REPO / "README.md", *sorted(REPO.glob("docs/*.md"))]:
        for i, m in enumerate(block.finditer(page.read_text())):
            found.append((f"{page.relative_to(REPO)} block {i + 1}", m.group(1)))
    return found


def test_examples_and_docs_import_only_public_names() -> None:
    deep = []
    for where, code in _user_code():
        for module, name in _shardkit_imports(code):
            whole = module if name is None else f"{module}.{name}"
            if module in PUBLIC and (name is None or name in PUBLIC[module] or whole in PUBLIC):
                continue
            deep.append(f"{where}: {whole}")
    assert deep == []


FOUNDATION = {
    "Manifest",
    "Schedule",
    "ShardEntry",
    "ShardWriter",
    "read_shard",
    "__version__",
}


def test_all_is_sorted_and_unique() -> None:
    assert shardkit.__all__ == sorted(shardkit.__all__)
    assert len(set(shardkit.__all__)) == len(shardkit.__all__)


def test_every_name_resolves_and_public_api_has_docstrings() -> None:
    for name in shardkit.__all__:
        obj = getattr(shardkit, name)
        if name != "__version__":
            assert inspect.getdoc(obj), f"shardkit.{name} has no docstring"


def test_foundation_and_every_error_class_are_exported() -> None:
    assert set(shardkit.__all__) >= FOUNDATION
    classes = [n for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert len(classes) >= 12  # the tree; errors.py also exports redact and has_userinfo
    for name in classes:
        assert getattr(shardkit, name) is getattr(errors, name)
        assert name in shardkit.__all__
        assert issubclass(getattr(errors, name), errors.ShardkitError)


def test_nothing_public_is_left_out_of_all() -> None:
    public = {
        n
        for n, v in vars(shardkit).items()
        if not n.startswith("_") and not isinstance(v, (types.ModuleType, __future__._Feature))
    }
    assert public <= set(shardkit.__all__), sorted(public - set(shardkit.__all__))


def test_module_all_lists_are_sorted() -> None:
    import shardkit.check.verify
    import shardkit.format.checksum
    import shardkit.format.codecs
    import shardkit.format.manifest.model
    import shardkit.format.tario

    for mod in (
        errors,
        shardkit.format.checksum,
        shardkit.format.codecs,
        shardkit.format.manifest.model,
        shardkit.format.tario,
        shardkit.check.verify,
    ):
        assert mod.__all__ == sorted(mod.__all__), mod.__name__
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_verify_at_the_root_takes_a_path_or_a_manifest(
    make_shards: Callable[..., shardkit.Manifest], tmp_path: Path
) -> None:
    m = make_shards([3, 2], subdir="set")
    path = tmp_path / "set" / "manifest.json"
    by_path = shardkit.verify(path, level="deep")
    assert by_path.ok and by_path.shards == 2 and by_path.manifest == str(path)
    (tmp_path / "set" / "data-000001.tar").write_bytes(b"")
    by_manifest = shardkit.verify(m)
    assert not by_manifest.ok and by_manifest.bad_shards == ["data-000001.tar"]
