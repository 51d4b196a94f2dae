"""PerProcess and Counters tell a forked child from its parent (without asking the pid)."""

from __future__ import annotations

import itertools
import os
import pickle

import pytest

from shardkit.counters import Counters
from shardkit.io import CacheConfig
from shardkit.per_process import PerProcess, fork_generation

_made = itertools.count()


def _make() -> int:
    return next(_made)


def _in_child(fn: object) -> bytes:
    """Run ``fn()`` in a forked child; its pickled result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, pickle.dumps(fn()))  # type: ignore[operator]
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_makes_its_own_and_the_parent_keeps_its_own() -> None:
    res = PerProcess(_make)
    mine = res.get()
    assert res.get() == mine and res.peek() == mine  # made once in this process
    counters = Counters()
    counters.add("reads", 3)

    def child() -> tuple[int | None, int, int, dict[str, float], int]:
        before = res.peek()  # the parent's is not this process's
        counters.add("reads")
        return before, res.get(), res.get(), counters.snapshot(), fork_generation()

    before, first, again, snap, gen = pickle.loads(_in_child(child))
    assert before is None
    assert first != mine and again == first  # made again in the child, once
    assert snap == {"reads": 1}  # the child counts from zero
    assert gen != fork_generation()
    assert res.get() == mine and counters.snapshot() == {"reads": 3}  # the parent's kept


def test_a_pickled_copy_carries_only_how_to_make_it() -> None:
    res = PerProcess(_make)
    res.get()
    copy = pickle.loads(pickle.dumps(res))
    assert copy.peek() is None
    assert copy.get() != res.get()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_every_process_resource_is_per_process(tmp_path: object) -> None:
    from shardkit.cache.ledger import Ledger
    from shardkit.cache.opener import CachingOpener
    from shardkit.io.config import IoConfig
    from shardkit.io.http import HttpFetcher
    from shardkit.io.hub import HubFetcher
    from shardkit.io.s3 import S3Fetcher

    for cls in (HttpFetcher, HubFetcher, S3Fetcher, CachingOpener, Ledger):
        assert "__getstate__" not in vars(cls), cls  # PerProcess is the one spelling
    src = HubFetcher(IoConfig(), Counters())
    mine = src.session
    assert src.session is mine
    clone = pickle.loads(pickle.dumps(src))  # what a spawned worker gets: no session
    assert clone._session.peek() is None and clone.session is not mine
    assert _in_child(lambda: id(src.session) != id(mine)) == pickle.dumps(True)
    opener = CachingOpener(IoConfig(cache=CacheConfig(cache_dir=str(tmp_path))))
    local = opener._local
    assert pickle.loads(pickle.dumps(opener))._locals.peek() is None
    assert opener._local is local
