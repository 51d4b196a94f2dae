"""Read a built data set back, independently of the writer: samples and shard integrity."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterable, Iterator
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
    """Run the ``shardkit`` CLI as a user does, in this process: its entry point
    (:func:`shardkit.cli.main`: exit codes, one-line errors) on ``args``, file descriptors
    1 and 2 captured as a process's pipes are (what its worker processes, forked or spawned,
    write included), the library's warnings on stderr (as Python's last-resort handler
    prints them in a process of its own), and an exception that escapes printed there as
    Python prints it, exit 1. A fresh interpreter spent 0.6-2.5 s of CPU on imports a call,
    155 calls in the suite; :func:`shardkit_process` runs one where the process itself is
    what is tested."""
    from shardkit.cli import main

    argv = [str(a) for a in args]
    with _fds_captured() as (out, err):
        warnings = logging.StreamHandler(sys.stderr)  # descriptor 2's, now captured
        warnings.setLevel(logging.WARNING)
        root = logging.getLogger()
        root.addHandler(warnings)
        try:
            main(argv)
            rc = 0
        except SystemExit as exc:
            rc = _exit_code(exc.code)
        except Exception:  # noqa: BLE001 -- what a process prints when an error escapes main
            traceback.print_exc()
            rc = 1
        finally:
            root.removeHandler(warnings)
    cmd = [sys.executable, "-m", "shardkit", *argv]
    return subprocess.CompletedProcess(cmd, rc, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _fds_captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr`` on them) into temporary files
    while the block runs; their text in the two buffers once it has."""
    texts = io.StringIO(), io.StringIO()
    streams = sys.stdout, sys.stderr
    for stream in streams:
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            yield texts
        finally:
            for mine in (sys.stdout, sys.stderr):
                mine.flush()
                mine.close()
            sys.stdout, sys.stderr = streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        for buf, f in zip(texts, (out, err), strict=True):
            f.seek(0)
            buf.write(f.read().decode("utf-8", "replace"))


def _exit_code(code: object) -> int:
    """A process's exit status for ``sys.exit(code)``: a message is printed, status 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def shardkit_process(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run the ``shardkit`` CLI in a fresh process (``python -m shardkit``)."""
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
