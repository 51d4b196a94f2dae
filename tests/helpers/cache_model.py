"""A seeded model of the node cache under attack (issue 19 item 6), run by
tests/property/test_cache_model.py (bounded) and scripts/cache_model.py (long).

The world: one cache dir with a limit, a Range server that lies (wrong bytes, short and
long bodies, 200 for a Range, another object's bytes, stalls, trickles, 429/500), 2-3
real reader processes sharing the cache, and two jobs whose manifests name the same
checksums: job ``a`` honest, job ``b`` with the piece tables of other bytes. The driver
sends each reader a random read (a whole shard or a range, of either job), and at random
points SIGKILLs a reader (a new one takes its place) or SIGSTOPs it for a while.

What must hold, whatever happens: a read of job ``a`` returns exactly the source bytes
or raises a named shardkit error; a read of job ``b`` never returns its own bytes (they
are not the checksum's: it gets the checksum's bytes, from the cache, or an error); every
read returns within its bound; the bytes the cache holds stay
under its limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.data import make_shards
from tests.helpers.servers import RangeServer

ROOT = Path(__file__).resolve().parents[2]
PIECE = 32_000
BOUND = 25.0  # seconds a read may take: cache_wait + deadline + a stopped peer's lease
OPTIONS = {  # the readers' io options, by concern
    "io": {"read_timeout": 1.0, "connect_timeout": 1.0},
    "retry": {
        "deadline": 5.0,
        "max_attempts": 4,
        "backoff_base": 0.05,
        "backoff_max": 0.2,
        "retry_after_max": 0.5,
    },
    "cache": {"cache_wait": 6.0, "piece_parallel": 2, "node_requests": 3, "prefetch_depth": 0},
}

_READER = """
import hashlib, json, sys, time
from shardkit._types import ObjectRef
from shardkit.cache import opener_for
from shardkit.errors import ShardkitError
from shardkit.format.pieces import Pieces
from shardkit.io import CacheConfig, IoConfig, RetryPolicy
cache, limit, o = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
store = CacheConfig(cache_dir=cache, cache_limit=limit, **o["cache"])
opener = opener_for(IoConfig(cache=store, retry=RetryPolicy(**o["retry"]), **o["io"]))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    op = json.loads(line)
    t0 = time.monotonic()
    p = op["pieces"]
    pieces = None if p is None else Pieces(p["size"], tuple(p["digests"]))
    try:
        ref = ObjectRef(op["url"], op["size"], op["checksum"], pieces)
        with opener.open(ref, op["lo"], op["hi"]) as f:
            data = f.read()
        out = {"ok": True, "digest": hashlib.sha256(data).hexdigest()}
    except ShardkitError as exc:
        out = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:300]}
    out["took"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
"""


@dataclass
class Report:
    """What a run saw: reads by outcome, and every broken invariant."""

    outcomes: dict[str, int] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    kills: int = 0
    stops: int = 0

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1


class _Reader:
    def __init__(self, cache: str, limit: int) -> None:
        pieces_opts = json.dumps(OPTIONS)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _READER, cache, str(limit), pieces_opts],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.stopped_until = 0.0
        assert json.loads(self._line(60.0) or "{}").get("ready")

    def _line(self, timeout: float) -> str | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def send(self, op: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(op) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.stopped_until:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def _world(tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, bytes]]:
    """Job a's shards and job b's (same checksums, other bytes and their piece tables)."""
    a = make_shards(tmp / "a", [6, 6, 6], tokens=3000, piece_size=PIECE)
    b = make_shards(tmp / "b", [6, 6, 6], tokens=3000, piece_size=PIECE, seed=1)
    sources: dict[str, bytes] = {}
    job_a, job_b = [], []
    for sa, sb in zip(a.shards, b.shards, strict=True):
        assert sa.size == sb.size
        sources[f"/a/{sa.url}"] = (tmp / "a" / sa.url).read_bytes()
        job_a.append(
            {"path": f"/a/{sa.url}", "size": sa.size, "checksum": sa.checksum, "pieces": sa.pieces}
        )
        job_b.append(
            {"path": f"/b/{sb.url}", "size": sb.size, "checksum": sa.checksum, "pieces": sb.pieces}
        )
    return job_a, job_b, sources


def _fault(rng: random.Random, srv: RangeServer, shard: dict[str, Any], other: str) -> None:
    """One lie of the server, on the next request for ``shard`` (maybe)."""
    path, size = shard["path"], shard["size"]
    kind = rng.choice(
        [
            "none",
            "none",
            "corrupt",
            "drop",
            "long",
            "long-honest",
            "full",
            "swap",
            "stall",
            "trickle",
            "429",
            "500",
        ]
    )
    times = rng.choice([1, 1, 2, 5])
    if kind == "corrupt":
        srv.add_fault(path, "corrupt", at=rng.randrange(size), times=times)
    elif kind == "drop":
        srv.add_fault(path, "drop", after=rng.randrange(1, PIECE), times=times)
    elif kind.startswith("long"):
        srv.add_fault(
            path, "long", after=rng.randrange(1, PIECE), honest=kind != "long", times=times
        )
    elif kind in ("full", "swap"):
        srv.add_fault(path, kind, other=other, times=times)
    elif kind == "stall":
        srv.add_fault(path, "stall", after=rng.randrange(1, PIECE), seconds=3.0, times=1)
    elif kind == "trickle":
        srv.add_fault(path, "trickle", after=1000, step=50, seconds=0.1, times=1)
    elif kind in ("429", "500"):
        srv.add_fault(path, "status", status=int(kind), retry_after="0", times=times)


def _usage(cache: Path) -> int:
    """Bytes of the files in data/ and tmp/ (removed files still open are not seen)."""
    total = 0
    for sub in ("data", "tmp"):
        for p in (cache / sub).rglob("*"):
            try:
                if p.is_file():
                    total += p.stat().st_size
            except FileNotFoundError:
                pass
    return total


def run_model(tmp: Path, *, seed: int, steps: int, readers: int = 3) -> Report:
    """One seeded run of ``steps`` reads (see the module docstring)."""
    rng = random.Random(seed)
    job_a, job_b, sources = _world(tmp)
    cache = tmp / "cache"
    limit = 2 * max(s["size"] for s in job_a) + 3 * len(job_a) * 8 + 2 * PIECE
    limit = int(limit * 1.5)
    report = Report()
    with RangeServer(tmp) as srv:
        pool = [_Reader(str(cache), limit) for _ in range(readers)]
        pending: dict[int, tuple[dict[str, Any], float, _Reader]] = {}
        try:
            for step in range(steps):
                i = rng.randrange(readers)
                r = pool[i]
                if id(r) in pending:
                    _collect(pending, r, report, sources, block=True)
                job = rng.choice(["a", "a", "a", "b"])
                k = rng.randrange(len(job_a))
                shard = (job_a if job == "a" else job_b)[k]
                other = (job_b if job == "a" else job_a)[k]["path"]
                _fault(rng, srv, shard, other)
                lo, hi = 0, shard["size"]
                if job == "a" and rng.random() < 0.5:
                    lo = rng.randrange(shard["size"])
                    hi = rng.randrange(lo, shard["size"]) + 1
                pieces = shard["pieces"]
                op = {
                    "url": srv.url(shard["path"]),
                    "lo": lo,
                    "hi": hi,
                    "size": shard["size"],
                    "checksum": shard["checksum"],
                    "pieces": None
                    if pieces is None
                    else {"size": pieces.size, "digests": list(pieces.digests)},
                }
                r.send(op)
                truth = job_a[k]["path"]  # the bytes the checksum names, whichever job asks
                pending[id(r)] = ({**op, "job": job, "path": truth}, time.monotonic(), r)
                _chaos(rng, pool, pending, report, cache, limit, step)
                for other_r in pool:
                    if id(other_r) in pending and other_r.stopped_until <= time.monotonic():
                        _collect(pending, other_r, report, sources, block=False)
                used = _usage(cache)
                if used > limit:
                    report.broken.append(f"step {step}: the cache holds {used} > {limit}")
            for r in pool:
                if r.stopped_until:
                    os.kill(r.proc.pid, signal.SIGCONT)
                if id(r) in pending:
                    _collect(pending, r, report, sources, block=True)
        finally:
            for r in pool:
                r.kill()
    return report


def _chaos(
    rng: random.Random,
    pool: list[_Reader],
    pending: dict[int, tuple[dict[str, Any], float, _Reader]],
    report: Report,
    cache: Path,
    limit: int,
    step: int,
) -> None:
    """Maybe SIGKILL a reader (replaced), maybe SIGSTOP one for a while, or wake one."""
    now = time.monotonic()
    for r in pool:
        if r.stopped_until and r.stopped_until <= now:
            os.kill(r.proc.pid, signal.SIGCONT)
            r.stopped_until = 0.0
            op = pending.get(id(r))
            if op is not None:  # its read's clock stopped while it was stopped
                pending[id(r)] = (op[0], now, r)
    roll = rng.random()
    if roll < 0.08:
        i = rng.randrange(len(pool))
        time.sleep(rng.uniform(0, 0.3))  # somewhere in its read
        pool[i].kill()
        pending.pop(id(pool[i]), None)
        pool[i] = _Reader(str(cache), limit)
        report.kills += 1
    elif roll < 0.14:
        r = pool[rng.randrange(len(pool))]
        if not r.stopped_until:
            time.sleep(rng.uniform(0, 0.3))
            os.kill(r.proc.pid, signal.SIGSTOP)
            r.stopped_until = now + rng.uniform(0.5, 4.0)
            report.stops += 1
    del step


def _collect(
    pending: dict[int, tuple[dict[str, Any], float, _Reader]],
    r: _Reader,
    report: Report,
    sources: dict[str, bytes],
    *,
    block: bool,
) -> None:
    """Take the answer of ``r``'s read, if it is there (``block``: wait up to the bound)."""
    op, began, _ = pending[id(r)]
    if r.stopped_until:
        os.kill(r.proc.pid, signal.SIGCONT)
        r.stopped_until = 0.0
        began = time.monotonic()
    left = BOUND - (time.monotonic() - began) if block else 0.0
    line = r._line(max(0.0, left))
    if line is None:
        if block:
            report.broken.append(f"no answer within {BOUND} s: {op['path']} {op['lo']}..{op['hi']}")
            pending.pop(id(r))
        return
    pending.pop(id(r))
    out = json.loads(line)
    if out["took"] > BOUND:
        report.broken.append(f"a read took {out['took']:.1f} s: {op['path']}")
    if not out["ok"]:
        report.count(f"{op['job']}:{out['error']}")
        return
    report.count(f"{op['job']}:ok")
    if out["digest"] != hashlib.sha256(sources[op["path"]][op["lo"] : op["hi"]]).hexdigest():
        report.broken.append(f"wrong bytes: {op['path']} {op['lo']}..{op['hi']}")
