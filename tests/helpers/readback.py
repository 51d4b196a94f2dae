"""Read a built data set back, independently of the writer: samples and shard integrity."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash

from shardkit._types import ObjectRef
from shardkit.format.layout import HF_CONFIG, INDEX_DIR
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.reader import read_shard

_HASHES = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}


def read_samples(
    manifest: str | os.PathLike[str] | Manifest, opener: Any = None, **resolve: Any
) -> list[dict[str, Any]]:
    """Every sample of every shard the manifest lists, in manifest order: read from the
    resolved paths, or through ``opener.open`` (told each shard's size, checksum, pieces)."""
    m = manifest if isinstance(manifest, Manifest) else Manifest.load(manifest)
    out: list[dict[str, Any]] = []
    for s in m.shards:
        url = m.resolve(s.url, **resolve)
        if opener is None:
            out.extend(read_shard(url))
            continue
        with opener.open(ObjectRef(url, s.size, s.checksum, s.pieces)) as f:
            out.extend(read_shard(f, url=url))
    return out


def keys_of(samples: Iterable[dict[str, Any]]) -> list[str]:
    return [str(s["__key__"]) for s in samples]


def file_digest(path: str | os.PathLike[str], algo: str = "sha256") -> str:
    h = _HASHES[algo]()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"{algo}:{h.hexdigest()}"


def assert_whole(manifest_path: str | os.PathLike[str]) -> Manifest:
    """Each listed shard exists with its size and checksum and holds ``nsamples`` samples."""
    m = Manifest.load(manifest_path)
    for s in m.shards:
        path = m.resolve(s.url)
        assert os.path.getsize(path) == s.size, s.url
        assert file_digest(path, m.checksum_algorithm) == s.checksum, s.url
        assert sum(1 for _ in read_shard(path)) == s.nsamples, s.url
    return m


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return p


def shard_digests(manifest_path: str | os.PathLike[str]) -> list[tuple[str, str, int]]:
    """``(url, checksum, nsamples)`` of every shard: equal lists mean equal shard bytes."""
    m = Manifest.load(manifest_path)
    return [(s.url, s.checksum, s.nsamples) for s in m.shards]


def shardkit(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run the ``shardkit`` CLI in a fresh process, as a user does."""
    return subprocess.run(
        [sys.executable, "-m", "shardkit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def hidden_leftovers(out: str | os.PathLike[str]) -> list[str]:
    """Hidden names in a build's output (temp files, a work dir, a lock) and in its
    ``.index/`` folder, less the layout's own (``.index/``, ``.huggingface.yaml``)."""
    names = [n for n in os.listdir(out) if n.startswith(".") and n not in (INDEX_DIR, HF_CONFIG)]
    indexes = os.path.join(out, INDEX_DIR)
    if os.path.isdir(indexes):
        names += [f"{INDEX_DIR}/{n}" for n in os.listdir(indexes) if n.startswith(".")]
    return sorted(names)


def files_under(folder: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """Every file under ``folder`` (``.index/`` too) with its ``/``-separated relative name:
    what an upload of a data set's folder to an object store must carry."""
    root = Path(folder)
    return [(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*")) if p.is_file()]
