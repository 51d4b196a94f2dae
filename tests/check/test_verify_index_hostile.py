"""Plain ``verify``'s sample index check against manifests that lie about a shard: what
it reads stays bounded by the file, and every lie is a problem naming the shard."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import shardkit as sk
from shardkit import Manifest

pytestmark = pytest.mark.integration


def test_a_sample_count_past_any_memory_is_a_problem_not_a_memory_error(
    make_shards: Callable[..., Manifest], tmp_path: Path
) -> None:
    """A manifest saying a shard holds 10**15 samples: the index read asks for up to the
    largest index of that count (24 PB), and a local read allocated what it asked for
    first (MemoryError out of sk.verify and the CLI). The read stops at the file's end and
    the count is the problem."""
    make_shards([4, 3], subdir="set")
    path = tmp_path / "set" / "manifest.json"
    m = Manifest.load(path)
    m.shards[0] = replace(m.shards[0], nsamples=10**15)
    m.save(path)
    (p,) = sk.verify(path).problems
    assert (p.url, p.kind, p.expected, p.found) == ("data-000000.tar", "index", 10**15, 4)
    (p,) = sk.verify(path, level="deep").problems
    assert (p.kind, p.expected, p.found) == ("nsamples", 10**15, 4)
