"""A store that throttles: an HTTP origin on 127.0.0.1 serving ``rate`` requests per
second (a token bucket of ``burst`` tokens), answering the rest 429 with ``Retry-After``
(``mode="retry-after"``) or a bare 503 as S3 does (``mode="503"``); and a job of several
node processes (each its own cache dir, ``workers`` DataLoader workers) reading one epoch
from it at once. Used by ``tests/io/test_throttle.py`` and ``scripts/bench/throttle.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.helpers.servers import RangeServer, _Handler

__all__ = ["MODES", "Epoch", "ThrottlingServer", "run_job"]

ROOT = Path(__file__).resolve().parents[2]
MODES = ("retry-after", "503")
_NODE = r"""
import json, sys, time
import shardkit as sk
url, cache, rank, world, workers, options = sys.argv[1:7]
io = sk.IoConfig(cache=sk.io.CacheConfig(cache_dir=cache, **json.loads(options)))
ds = sk.ShardDataset(url, seed=1, io=io)
loader = sk.WebLoader(ds.split_by_node(int(rank), int(world)), num_workers=int(workers))
print("ready", flush=True)
sys.stdin.readline()  # every node starts its epoch at once
t0 = time.monotonic()
rows = [(s["__key__"], bytes(s["json"]).decode()) for s in loader]
print(json.dumps({"rows": rows, "seconds": time.monotonic() - t0}))
"""


class _Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` held."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.at = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1:
                return False
            self.tokens -= 1
            return True


class _ThrottlingHandler(_Handler):
    srv: ThrottlingServer

    def _answer(self, path: str, rec: Any, body: bool) -> None:
        if self.srv.bucket.take():
            return super()._answer(path, rec, body)
        if self.srv.mode == "retry-after":
            return self._empty(rec, 429, {"Retry-After": str(self.srv.retry_after)})
        return self._empty(rec, 503, {})


class ThrottlingServer(RangeServer):
    """A :class:`RangeServer` behind a token bucket (see the module docstring).

    Args:
        root: the directory served.
        rate: requests per second served.
        burst: tokens the bucket holds (requests served at once after a quiet spell).
        mode: ``"retry-after"`` (429 with ``Retry-After``) or ``"503"`` (bare 503).
        retry_after: the seconds a 429 names.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rate: float,
        burst: float = 5.0,
        mode: str = "retry-after",
        retry_after: int = 1,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        super().__init__(root)
        self.bucket = _Bucket(rate, burst)
        self.mode = mode
        self.retry_after = retry_after
        handler = type("Handler", (_ThrottlingHandler,), {"srv": self})
        self._httpd.RequestHandlerClass = handler

    def counts(self, since: float = 0.0) -> dict[str, Any]:
        """GETs served and throttled from ``since`` (a :func:`time.time`) on, and the time
        from ``since`` (or the first) to the last."""
        log = [r for r in self.requests("*") if r.start >= since]
        throttled = sum(r.status in (429, 503) for r in log)
        first = since or min((r.start for r in log), default=0.0)
        span = max(r.end for r in log) - first if log else 0.0
        return {"requests": len(log), "throttled": throttled, "span_s": span}


@dataclass
class Epoch:
    """What one job's epoch against a throttling origin did."""

    requests: int
    throttled: int
    seconds: float  # from the origin's first request to its last
    origin_seconds: float  # what the served requests take at the origin's rate alone
    loader_seconds: float  # the slowest node's loader, from its first batch asked to its end
    rows: list[tuple[str, Any]]

    @property
    def throttled_share(self) -> float:
        return self.throttled / max(1, self.requests)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["rows"]
        return {**out, "throttled_share": self.throttled_share, "samples": len(self.rows)}


def run_job(
    server: ThrottlingServer,
    cache_root: str | os.PathLike[str],
    nodes: int,
    workers: int,
    *,
    options: dict[str, Any] | None = None,
    timeout: float = 600.0,
) -> Epoch:
    """One epoch of ``nodes`` node processes (one rank each, its own cache dir under
    ``cache_root``, ``workers`` DataLoader workers) reading ``server``'s manifest.json
    at once; ``options`` are the cache's (``CacheConfig`` fields such as ``rate_adapt``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for n in range(nodes):
        cache = os.path.join(os.fspath(cache_root), f"node{n}")
        args = [server.url("manifest.json"), cache, n, nodes, workers, json.dumps(options or {})]
        cmd = [sys.executable, "-c", _NODE, *map(str, args)]
        pipe = subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=env, stdin=pipe, stdout=pipe, stderr=pipe))
    try:
        for p in procs:  # the manifest read and the loader made: ready to start
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a node failed: {p.communicate()[1].decode()[-3000:]}")
        go = time.time()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        rows: list[tuple[str, Any]] = []
        seconds = 0.0
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"a node failed: {err.decode()[-3000:]}")
            got = json.loads(out.decode().strip().splitlines()[-1])
            rows += [(k, v) for k, v in got["rows"]]
            seconds = max(seconds, got["seconds"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    c = server.counts(go)
    origin = (c["requests"] - c["throttled"]) / server.bucket.rate
    return Epoch(c["requests"], c["throttled"], c["span_s"], origin, seconds, rows)
