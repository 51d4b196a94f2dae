"""The public surface: ``shardkit.__all__`` is sorted, complete and importable."""

from __future__ import annotations
import __future__

import inspect
import types

import shardkit
from shardkit import errors

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
    for name in errors.__all__:
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
