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
which ``load_dataset(directory)`` reads beside a README's card, names the shards as the data
files of the ``train`` split; a file of that name not written by shardkit is left alone.
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


def write_hf_config(directory: str, urls: Iterable[str]) -> None:
    """Write ``.huggingface.yaml`` in ``directory`` naming the shards among ``urls`` as the
    ``train`` split; nothing where none lies there or the file is not shardkit's."""
    patterns = hf_data_files(urls)
    if not patterns:
        return
    path = os.path.join(directory, HF_CONFIG)
    lines = [
        f"{_MARK}: Hugging Face datasets loads this directory's shards as the train split",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path:",
        *(f"    - {json.dumps(p)}" for p in patterns),
    ]
    text = "\n".join(lines) + "\n"
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError):
        return  # unreadable: not ours to replace
    if old is not None and (old == text or not old.startswith(_MARK)):
        return
    atomic_write(path, text.encode())
