"""The layering of STYLE.md, kept true: imports point one way, down the layer order.

The order is written once, here, for the packages of ``shardkit`` and for the modules inside
each package that has one. A module may import a unit of a lower layer, or of its own layer
listed before it (so a layer has a one-way order inside too); never a higher one, never one
listed after it in its own layer. Every import counts, also those inside functions (a lazy
import hides a cycle; it does not remove it). Inside a package with no order here its modules
may import each other freely (the package is one unit); the package root re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import shardkit

# package -> its units in layers, lowest first; inside a layer, earlier before later
ORDER: dict[str, list[list[str]]] = {
    "shardkit": [
        [
            "_version",
            "_types",
            "errors",
            "units",
            "values",
            "urls",
            "per_process",
            "counters",
            "activity",
            "durable",
        ],
        ["format"],
        ["io"],
        ["write"],
        ["check"],
        ["plan"],
        ["cache"],
        ["read"],
        ["stages", "metrics", "streaming"],
        ["ray"],
        ["cli", "__main__"],
    ],
    "shardkit.urls": [["schemes", "objects", "resolve"]],
    "shardkit.format": [
        ["checksum", "pieces", "digest", "images", "codecs", "zstd", "compression", "layout"],
        ["manifest", "tario"],
    ],
    "shardkit.format.manifest": [
        ["check", "model", "compact_file", "compact_source", "compact_pieces", "compact", "journal"]
    ],
    "shardkit.format.tario": [
        [
            "names",
            "headers",
            "extended",
            "sparse",
            "buffer",
            "members",
            "fast_extended",
            "index",
            "reader",
            "writer",
        ]
    ],
    "shardkit.write": [["inputs"], ["writer"], ["build"]],
    "shardkit.write.inputs": [
        ["select", "table_meta", "image_check", "sources", "discover", "tables", "records"]
    ],
    "shardkit.write.writer": [
        [
            "lock",
            "options",
            "members",
            "shard_bytes",
            "target",
            "local",
            "object_lock",
            "objects",
            "where",
            "shard_writer",
        ]
    ],
    "shardkit.write.build": [["config", "workers", "join", "plan", "run", "merge"]],
    "shardkit.check": [
        ["scan", "summary", "decoded", "report", "index_file", "shard", "verify", "adopt"]
    ],
    "shardkit.plan": [
        ["world", "order", "schedule", "ranges", "resampled", "generation", "assign"]
    ],
    "shardkit.io": [
        [
            "retry",
            "clocked",
            "rate",
            "config",
            "pipe",
            "http",
            "hub",
            "s3",
            "blobs",
            "store_base",
            "store_s3",
            "store_gs",
            "store_az",
            "stores",
            "verified",
            "verified_samples",
            "local",
            "remote",
        ]
    ],
    "shardkit.cache": [
        [
            "locks",
            "ledger",
            "layout",
            "folder",
            "store",
            "upkeep",
            "manifests",
            "download",
            "verdict",
            "fill",
            "stream",
            "gate",
            "opener_process",
            "opener",
        ]
    ],
    "shardkit.read": [
        [
            "policy",
            "indexes",
            "remote_compact",
            "shards",
            "catalog",
            "stream",
            "piece_opener",
            "sample_parse",
            "lookup",
            "keys",
        ]
    ],
    "shardkit.stages": [
        [
            "base",
            "collate",
            "packing",
            "decode",
            "reading",
            "source",
            "epoch",
            "nominal",
            "mix_draws",
        ],
        ["mixture", "regroup", "costs", "budget", "basic", "tokens"],
    ],
    "shardkit.metrics": [["schema", "job", "alert", "export"]],
    "shardkit.streaming": [
        [
            "resume",
            "retired",
            "allow",
            "shared",
            "transfer",
            "device",
            "slot_layout",
            "arena",
            "bundles",
            "sync",
            "frameworks",
            "recipe",
            "dataset",
            "indexed",
            "mixing",
            "workers",
            "worker_modes",
            "stall",
            "place",
            "loader",
            "measure",
        ]
    ],
    "shardkit.cli": [
        ["_fields", "_plot", "_tune", "build", "bench"],
        ["cache", "demo", "inspect", "manifest", "plan", "state", "verify"],
    ],
}
LAYERS = ORDER["shardkit"]
ROOT = Path(shardkit.__file__).parent


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


def _rank(package: str) -> dict[str, tuple[int, int]]:
    layers = ORDER[package]
    return {name: (i, j) for i, layer in enumerate(layers) for j, name in enumerate(layer)}


def _edges() -> set[tuple[str, str, int]]:
    """(importing module, imported module, line) for every shardkit import of every module."""
    out: set[tuple[str, str, int]] = set()
    for path in ROOT.rglob("*.py"):
        module = _module_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module.startswith("shardkit"):
                    names += [f"{node.module}.{a.name}" for a in node.names]
                if node.module == "shardkit" and not all(
                    _exists(f"shardkit.{a.name}") for a in node.names
                ):
                    out.add((module, "shardkit.__init__", node.lineno))
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                if "shardkit" in names:
                    out.add((module, "shardkit.__init__", node.lineno))
            for name in names:
                if name.startswith("shardkit.") and _exists(name):
                    out.add((module, name, node.lineno))
    return out


def _exists(module: str) -> bool:
    path = ROOT.parent / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _split(a: str, b: str) -> tuple[str, str, str] | None:
    """The deepest package holding both modules and the units of each inside it."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    if n >= len(pa) or n >= len(pb):
        return None  # one is inside the other: a package and its own modules
    return ".".join(pa[:n]), pa[n], pb[n]


def test_every_unit_has_a_place_in_the_order() -> None:
    missing = []
    for package in ORDER:
        folder = ROOT.parent / package.replace(".", "/")
        units = {p.stem for p in folder.glob("*.py")} | {
            p.name for p in folder.iterdir() if (p / "__init__.py").exists()
        }
        units.discard("__init__")
        missing += [f"{package}.{u}" for u in sorted(units - set(_rank(package)))]
    assert not missing, f"not in ORDER: {missing}"


def test_the_root_reads_as_the_layers() -> None:
    entries = [p for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()]
    assert len(entries) <= 24, sorted(p.name for p in entries)


def test_imports_point_down_the_layer_order() -> None:
    wrong = []
    for a, b, line in sorted(_edges()):
        split = _split(a, b)
        if split is None:
            continue
        package, ua, ub = split
        if package == "shardkit" and ua == "__init__":
            continue  # the package root re-exports the public names
        if package not in ORDER:
            continue
        rank = _rank(package)
        if ub == "__init__" or (package == "shardkit" and b == "shardkit"):
            wrong.append(f"{a} imports the package root (line {line})")
        elif ua in rank and ub in rank and rank[ub] >= rank[ua]:
            wrong.append(f"{a} (layer {rank[ua]}) imports {b} (layer {rank[ub]}), line {line}")
    assert not wrong, "imports pointing up the layer order:\n" + "\n".join(wrong)


def test_no_module_exports_a_neighbours_names() -> None:
    """A module is one concept: what it lists in ``__all__`` it defines (a package's
    ``__init__`` gathers its public names; a module that re-exports a sibling's spells one
    name two ways, so callers split between them)."""
    root = Path(shardkit.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        imported: dict[str, str] = {}
        listed: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardkit"):
                imported.update({a.asname or a.name: str(node.module) for a in node.names})
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                listed = list(ast.literal_eval(node.value))
        found += [
            f"{path.relative_to(root)}: {n} (from {imported[n]})" for n in listed if n in imported
        ]
    assert not found, "re-exported: " + "; ".join(found)


MAX_LINES = 400  # STYLE.md: a module past ~400 lines is split along a concept


def test_no_module_is_over_400_lines() -> None:
    """A module is one concept: one that grows past 400 lines is split along a concept (a
    move, its callers updated), never trimmed or cut in half."""
    long = {}
    for path in sorted(ROOT.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long[str(path.relative_to(ROOT.parent))] = n
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"
