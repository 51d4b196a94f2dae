"""The layering of STYLE.md, kept true: imports point one way, down the layer order.

The order is written once, here. A module may import a module of a lower layer, or of its
own layer listed before it (so a layer has a one-way order inside too); never a higher
one, never one listed after it in its own layer. Every import counts, also those inside
functions (a lazy import hides a cycle; it does not remove it). A package's modules may
import each other freely (the package is one unit); the package root re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import shardkit

# lowest first; inside a layer, earlier before later
LAYERS: list[list[str]] = [
    ["_version", "_types", "errors", "units", "urls", "counters", "durable"],
    [
        "checksum",
        "pieces",
        "digest",
        "images",
        "codecs",
        "compression",
        "table_meta",
        "manifest_check",
        "manifest",
        "compact_pieces",
        "compact",
        "tario",
    ],
    [
        "tree_select",
        "sources",
        "sources_table",
        "source_read",
        "journal",
        "writer",
        "build_config",
        "build_workers",
        "build_plan",
        "build",
        "summary",
        "verify",
        "adopt",
    ],
    ["world", "order", "ranges", "plan"],
    ["io", "cache"],
    ["read"],
    ["stages", "resume", "metrics", "transfer", "sync", "dataset", "mixing", "loader", "export"],
    ["ray"],
    ["cli", "__main__"],
]
ROOT = Path(shardkit.__file__).parent


def _unit(module: str) -> str:
    """The layer unit of ``shardkit.x.y``: ``x`` (a top-level module or package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _rank() -> dict[str, tuple[int, int]]:
    return {name: (i, j) for i, layer in enumerate(LAYERS) for j, name in enumerate(layer)}


def _imports() -> dict[str, set[tuple[str, int]]]:
    """unit -> {(imported unit, line)} for every shardkit import of every module."""
    out: dict[str, set[tuple[str, int]]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        unit = _unit(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "shardkit":
                    names = [f"shardkit.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("shardkit.") and _unit(name) != unit:
                    out.setdefault(f"{unit}", set()).add((_unit(name), node.lineno))
    return out


def test_every_unit_has_a_place_in_the_order() -> None:
    units = {_unit(".".join(("shardkit", p.stem))) for p in ROOT.glob("*.py")}
    units |= {_unit(f"shardkit.{p.name}") for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    units.discard("__init__")
    placed = set(_rank())
    assert units <= placed, f"not in LAYERS: {sorted(units - placed)}"


def test_imports_point_down_the_layer_order() -> None:
    rank = _rank()
    wrong = []
    for unit, deps in sorted(_imports().items()):
        if unit == "(root)":
            continue  # the package root re-exports the public names
        for dep, line in sorted(deps):
            if dep == "(root)":
                wrong.append(f"{unit} imports the package root (line {line})")
            elif dep in rank and unit in rank and rank[dep] >= rank[unit]:
                wrong.append(f"{unit} (layer {rank[unit]}) imports {dep} (layer {rank[dep]})")
    assert not wrong, "imports pointing up the layer order:\n" + "\n".join(wrong)
