"""Where a shard set's files lie in its directory, so that other tools read the directory.

A shard's sample index lies in the hidden folder ``.index/`` beside the shard
(``data-000000.tar`` -> ``.index/data-000000.tar.idx``; :func:`index_name` is the one place
that says so). Beside the shards, Hugging Face ``datasets`` took the indexes for shards:
resolving a directory it keeps every file with a ``.tar`` suffix followed by anything
(``data_files.py``: ``DataFilesList.filter`` matches ``.*(\\.tar)(\\..+)?$``), and failed on
them ("bad checksum"). It leaves out hidden files and files in hidden folders unless a pattern
names them (``_is_unrequested_hidden_file_or_is_inside_unrequested_hidden_dir``), as GNU tar
globs, ``ls`` and shardkit's own source walk do. Readers take an index's path from the
manifest entry's ``index`` field, so data sets written before (the index beside the shard,
:func:`legacy_index_name`) read as they are, and a resumed build may hold both.

The manifest files still count in ``datasets``' vote on a directory's format (the most common
extension wins, ``.json`` before ``.tar`` on a tie: ``infer_module_for_data_files_list``), so
a set of one or two shards was read as JSON. ``.huggingface.yaml`` (:func:`write_hf_config`),
which ``load_dataset(directory)`` reads beside a README's card, names each set's shards as
the data files of a split (``manifest.json`` the ``train`` split, ``val.json``
``validation``); a file of that name not written by shardkit is left alone.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable

from shardkit.durable import atomic_write

__all__ = [
    "HF_CONFIG",
    "INDEX_DIR",
    "hf_data_files",
    "index_name",
    "is_index_name",
    "hf_split",
    "legacy_index_name",
    "write_hf_config",
]

INDEX_DIR = ".index"
"""The hidden folder beside the shards that holds their sample indexes."""

HF_CONFIG = ".huggingface.yaml"
"""The Hugging Face ``datasets`` configuration a shard directory carries."""

_MARK = "# written by shardkit"
_NUMBERED = re.compile(r"^(?P<stem>.*-)\d+(?P<ext>\.tar(?:\.gz)?)$")


def index_name(shard: str) -> str:
    """The sample index of shard ``shard`` (a name, relative path or url; ``/`` separated):
    ``a/x.tar`` -> ``a/.index/x.tar.idx``."""
    head, sep, tail = shard.rpartition("/")
    return f"{head}{sep}{INDEX_DIR}/{tail}.idx"


def legacy_index_name(shard: str) -> str:
    """Where data sets written before the ``.index/`` folder hold a shard's index."""
    return shard + ".idx"


def is_index_name(name: str) -> bool:
    """Whether file name ``name`` is a sample index, in either layout."""
    return name.endswith(".idx")


def hf_data_files(urls: Iterable[str]) -> list[str]:
    """Patterns of the shards among ``urls`` that lie under the manifest's directory and that
    ``datasets`` reads (plain and gzip): numbered shards as one glob per name stem
    (``data-*.tar``), others by name."""
    out: dict[str, None] = {}
    for url in urls:
        outside = "://" in url or url.startswith("/") or ".." in url.split("/")
        if outside or url.endswith(".zst"):
            continue  # not under this directory; or zstd, which datasets reads as a plain tar
        m = _NUMBERED.match(url)
        pattern = glob.escape(m["stem"]) + "*" + m["ext"] if m else glob.escape(url)
        out[pattern] = None
    return list(out)


def hf_split(manifest: str) -> str:
    """The split a set in a folder is loaded as, from its manifest's name: ``manifest.json``
    (and a part's manifest) ``train``; ``val.json``, ``validation.json`` ``validation``;
    ``test.json`` ``test``; another name its own split."""
    stem = os.path.basename(manifest).split(".", 1)[0].lower()
    named = {"manifest": "train", "val": "validation", "valid": "validation", "dev": "validation"}
    return named.get(stem, re.sub(r"\W", "_", stem) or "train")


def _our_sets(text: str) -> dict[str, tuple[str, list[str]]]:
    """The sets an earlier shardkit config listed: manifest -> (split, patterns)."""
    sets: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if line.startswith("# set "):
            try:
                name, split, patterns = json.loads(line[len("# set ") :])
            except (ValueError, TypeError):
                continue
            sets[str(name)] = (str(split), [str(p) for p in patterns])
    return sets


def write_hf_config(directory: str, urls: Iterable[str], manifest: str = "manifest.json") -> None:
    """Write ``.huggingface.yaml`` in ``directory`` naming the shards among ``urls`` (the
    set of ``manifest``) as the data files of its split (:func:`hf_split`), beside the other
    sets written there before (a train and a val set both load); nothing where none lies
    there or the file is not shardkit's."""
    path = os.path.join(directory, HF_CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            old: str | None = f.read()
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError):
        return  # unreadable: not ours to replace
    if old is not None and not old.startswith(_MARK):
        return
    sets = _our_sets(old or "")
    patterns = hf_data_files(urls)
    if patterns:
        sets[manifest] = (hf_split(manifest), patterns)
    elif sets.pop(manifest, None) is None:
        return
    splits: dict[str, list[str]] = {}
    for split, pats in sets.values():
        splits.setdefault(split, []).extend(p for p in pats if p not in splits.get(split, []))
    order = sorted(splits, key=lambda n: ["train", "validation", "test", n].index(n))
    lines = [
        f"{_MARK}: Hugging Face datasets loads this directory's shard sets as these splits",
        *(f"# set {json.dumps([name, split, pats])}" for name, (split, pats) in sets.items()),
        "configs:",
        "- config_name: default",
        "  data_files:",
    ]
    for split in order:
        lines += [
            f"  - split: {split}",
            "    path:",
            *(f"    - {json.dumps(p)}" for p in splits[split]),
        ]
    text = "\n".join(lines) + "\n"
    if old != text:
        atomic_write(path, text.encode())
