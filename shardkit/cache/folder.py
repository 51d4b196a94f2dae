"""Which folder may be a cache, and making one: a cache dir is marked by its CACHEDIR.TAG,
written before anything else; a folder that holds anything but a cache is never used as one
(eviction removes files under its ``data/``)."""

from __future__ import annotations

import os

from shardkit.cache.layout import scan_data
from shardkit.errors import CacheError

__all__ = ["make_folder", "refuse_foreign"]

# the names a cache dir holds (lost+found: a file system's root used whole as the cache)
_OWN = {"data", "tmp", "locks", "slots", "manifests", "manifest-cols", "keys", "ledger"}
_OWN |= {"lost+found", "CACHEDIR.TAG"}


def _own(name: str) -> bool:
    """A name the cache writes in its root: one of ``_OWN`` or a temp file of one
    (``ledger.tmp-*``, a durable write's ``.tmp-*``), as another process setting the cache
    up writes meanwhile (``data.csv`` is not one)."""
    stem, tmp, _ = name.partition(".tmp-")
    return name in _OWN or (bool(tmp) and stem in _OWN) or name.startswith(".tmp-")


_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# shardkit node-local shard cache\n"


def make_folder(root: str) -> None:
    """Create the cache's directory layout at ``root`` (a folder of something else is
    refused first; a clear :class:`CacheError` if it cannot)."""
    refuse_foreign(root)
    try:
        os.makedirs(root, exist_ok=True)
        tag = os.path.join(root, "CACHEDIR.TAG")
        if not os.path.exists(tag):  # first: a folder without it is not a cache
            with open(tag, "w") as f:
                f.write(_TAG)
        for sub in ("data", "tmp", "locks", "slots", "manifests"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot use cache dir {root}: {exc.strerror}") from exc


def refuse_foreign(root: str) -> None:
    """A folder without this cache's CACHEDIR.TAG holds nothing but the cache's own names,
    else a :class:`CacheError` names what it holds."""
    try:
        with open(os.path.join(root, "CACHEDIR.TAG")) as f:
            head = f.read(4096)
        if "shardkit" in head or _TAG.startswith(head):  # ours, or ours cut short
            return
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CacheError(f"cannot use cache dir {root}: {exc.strerror}") from exc
    try:
        other = sorted(n for n in os.listdir(root) if not _own(n))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CacheError(f"cannot use cache dir {root}: {exc.strerror}") from exc
    if next(scan_data(os.path.join(root, "data")), None) is not None:
        other.insert(0, "data/")  # files a cache would evict, under no tag of its own
    if other:
        shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        raise CacheError(
            f"{root} is not a shardkit cache (no shardkit CACHEDIR.TAG; it holds "
            f"{shown}): give an empty or new folder as the cache dir"
        )
