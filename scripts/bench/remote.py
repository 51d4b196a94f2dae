"""Remote benchmark: shardkit (node-local cache) vs webdataset over HTTP, 2 workers.

The server is the tests' RangeServer (tests/helpers/servers.py: HTTP/1.1 keep-alive,
Range, a latency added to every request, one bandwidth cap shared by all connections and
one per connection, as object stores cap single streams), run in its own process so that
it does not share a GIL with a reader. Its request log gives the requests at startup and
per epoch.

Two runs per profile:

- **one big shard** (``--big-size``, one shard) under the per-connection cap, batches of
  16: shardkit without a cache (each worker streams its own range), shardkit with the
  cache (pieces over parallel ranged requests), webdataset (one stream). The 10th batch
  with the cache is set against no cache, the first epoch against webdataset's;
- **many shards** (``--size`` in ``--shard-size`` shards), batches of 32, the contenders
  below, the first epoch set against the server's total cap; and the first epoch of a job
  of 2 ranks x 2 workers whose ranks (processes of their own) share one cache dir, with
  this code and, side by side, with ``--old-code DIR`` (a ``git worktree`` of an older
  commit, whose shardkit the ranks import instead). ``--no-peers`` leaves out the
  contenders below but shardkit's cache (they take most of the time of a large run).

Each contender is a fresh process that reads two epochs through a 2-worker loader with
batches of 32 decoded samples:

- shardkit: ShardDataset(manifest url, cache_dir=<empty dir on local disk>) + WebLoader;
  epoch 1 downloads through the cache, epoch 2 should read the cache only;
- webdataset: WebDataset(shard urls) + WebLoader, streaming every epoch (curl);
- webdataset with its own ``cache_dir`` (download whole shards, then read the local copy);
- the local limit: shardkit's loader over the same shards on local disk (the "plain local
  read" that epoch 2 is set against), and a raw sequential read of the files.

First-epoch MB/s is set against the bandwidth cap, second-epoch samples/s against the
local loader. Local reads are warm page-cache reads.

    .bench-venv/bin/python scripts/bench/remote.py --size 1GB --repeats 3
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the server process -------------------------------------------------------------------
def serve(root: str, latency: float, bandwidth: float, per_connection: float) -> None:
    """Serve ``root``; answer ``log`` / ``clear`` / ``quit`` lines on stdin."""
    sys.path.insert(0, _ROOT)
    from tests.helpers.servers import RangeServer

    cap = per_connection or None
    with RangeServer(root, latency=latency, bandwidth=bandwidth, per_connection=cap) as srv:
        print(json.dumps({"port": srv.port}), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "log":
                recs = srv.requests("*") + srv.requests("*", method="HEAD")
                out = [[r.method, r.path, r.range, r.status, r.sent, r.start, r.end] for r in recs]
                print(json.dumps(out), flush=True)
            elif cmd == "clear":
                srv.clear_log()
                print("{}", flush=True)
            elif cmd == "quit":
                break


class Server:
    """The server subprocess, seen from the harness."""

    def __init__(self, root: str, latency: float, bandwidth: float, per_connection: float) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--serve", root, str(latency)]
        cmd += [str(bandwidth), str(per_connection)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = json.loads(self._line())["port"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark server exited")
        return line

    def ask(self, cmd: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=30)


# -- the client processes ----------------------------------------------------------------
def _loader(spec: dict[str, Any]) -> Any:
    impl = spec["impl"]
    batch = spec.get("batch", 32)
    if impl in ("shardkit", "shardkit local"):
        import shardkit

        ds = shardkit.ShardDataset(spec["source"], cache_dir=spec.get("cache"), shardshuffle=False)
        if "world" in spec:  # one rank of a job whose ranks share the cache dir
            ds = ds.split_by_node(spec["rank"], spec["world"])
        return shardkit.WebLoader(ds.decode().batched(batch), num_workers=2)
    import webdataset as wds

    ds = wds.WebDataset(
        spec["urls"],
        shardshuffle=False,
        empty_check=False,
        cache_dir=spec.get("cache"),
        nodesplitter=None,
    )
    return wds.WebLoader(ds.decode().batched(batch), batch_size=None, num_workers=2)


def client(spec: dict[str, Any]) -> dict[str, Any]:
    """Two epochs through one loader; wall-clock marks so the harness can split the log."""
    import _readers

    marks = {"start": time.time()}
    loader = _loader(spec)
    epochs = []
    for epoch in range(spec["epochs"]):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        t0 = time.time()
        first, tenth, samples = None, None, 0
        for n, batch in enumerate(loader, 1):
            if first is None:
                first = time.time() - t0
            if n == 10:
                tenth = time.time() - t0
            samples += _readers._batch_len(batch)
        epochs.append(
            {
                "t0": t0,
                "t1": time.time(),
                "samples": samples,
                "first_batch_s": first,
                "tenth_batch_s": tenth,
            }
        )
    marks["end"] = time.time()
    return {"marks": marks, "epochs": epochs}


def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    from _common import run_script

    return run_script(__file__, "--client", spec)


def run_ranks(spec: dict[str, Any], world: int, code: str | None) -> list[dict[str, Any]]:
    """``world`` ranks of one job at once, each a client process (rank ``r`` of ``world``)
    with the same spec; ``code``: a checkout whose shardkit they import instead of this
    one (an older commit, measured side by side)."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.path.abspath(code)
    procs = []
    for rank in range(world):
        cmd = [sys.executable, os.path.abspath(__file__), "--client"]
        cmd.append(json.dumps({**spec, "rank": rank, "world": world}))
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
    outs = []
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"rank {rank} failed:\n{err.decode()}")
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return outs


def measure_ranks(server: Server, spec: dict[str, Any], nbytes: int, code: str | None) -> Any:
    """One first epoch of 2 ranks x 2 workers sharing one cache dir: from the first rank's
    ``iter()`` to the last rank's end, and the server's requests over the whole job."""
    server.ask("clear")
    outs = run_ranks(spec, 2, code)
    log = server.ask("log")
    t0 = min(o["epochs"][0]["t0"] for o in outs)
    t1 = max(o["epochs"][0]["t1"] for o in outs)
    lo, hi = min(o["marks"]["start"] for o in outs), max(o["marks"]["end"] for o in outs)
    return {
        "samples": [sum(o["epochs"][0]["samples"] for o in outs)],
        "epoch1_s": t1 - t0,
        "start_to_end_s": hi - lo,
        "epoch1_mb_per_s": nbytes / (t1 - t0) / 1e6,
        "requests": count_requests(log, lo - 1, hi + 1),
    }


def count_requests(log: list[list[Any]], lo: float, hi: float) -> dict[str, int]:
    """Requests that started in [lo, hi), by kind of file."""
    out = {"manifest": 0, "index": 0, "shard": 0, "other": 0, "bytes": 0}
    for _method, path, _range, _status, sent, start, *_end in log:
        if not lo <= start < hi:
            continue
        kind = "manifest" if path.endswith(".json") else "index" if path.endswith(".idx") else None
        kind = kind or ("shard" if ".tar" in path else "other")
        out[kind] += 1
        out["bytes"] += sent
    out["total"] = out["manifest"] + out["index"] + out["shard"] + out["other"]
    return out


def measure(server: Server, spec: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """One client run; its epochs' rates and the server requests of each phase."""
    server.ask("clear")
    out = run_client(spec)
    log = server.ask("log")
    e = out["epochs"]
    start = out["marks"]["start"]
    res: dict[str, Any] = {"samples": [x["samples"] for x in e]}
    first_at = e[0]["t0"] + (e[0]["first_batch_s"] or 0)
    res["startup_requests"] = count_requests(log, start - 1, first_at)
    for i, x in enumerate(e, 1):
        # epoch i's window runs from its iter() to the next epoch's (the last: to exit)
        lo = start - 1 if i == 1 else x["t0"]
        hi = e[i]["t0"] if i < len(e) else out["marks"]["end"] + 1
        res[f"epoch{i}_s"] = x["t1"] - x["t0"]
        res[f"epoch{i}_tenth_batch_s"] = x["tenth_batch_s"]
        res[f"epoch{i}_mb_per_s"] = nbytes / (x["t1"] - x["t0"]) / 1e6
        res[f"epoch{i}_requests"] = count_requests(log, lo, hi)
    return res


def _go(server: Server, spec: dict[str, Any], nbytes: int) -> Any:
    """A contender: one measured run of ``spec`` (on a fresh cache dir if it has one)."""
    from _common import fresh_dir

    def run() -> dict[str, Any]:
        if "cache" in spec:
            fresh_dir(spec["cache"])
        return measure(server, spec, nbytes)

    return run


def _go_ranks(server: Server, spec: dict[str, Any], nbytes: int, code: str | None) -> Any:
    """A contender: one first epoch of 2 ranks x 2 workers on a fresh shared cache dir."""
    from _common import fresh_dir

    def run() -> dict[str, Any]:
        fresh_dir(spec["cache"])
        return measure_ranks(server, spec, nbytes, code)

    return run


RANKS = "2 ranks x 2 workers, one cache"


def write_with(code: str, out: str, spec: dict[str, Any]) -> int:
    """Write the data set ``spec`` (profile, payload, shard bytes) into ``out`` with the
    shardkit of the checkout ``code`` (an older commit reads what its own writer wrote);
    the bytes of its shards."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    cmd = [sys.executable, os.path.abspath(__file__), "--write", json.dumps({**spec, "out": out})]
    subprocess.run(cmd, env=env, check=True)
    return sum(os.path.getsize(t) for t in glob.glob(os.path.join(out, "*.tar")))


def _write(spec: dict[str, Any]) -> None:
    import _common
    import _peers

    ds = _common.make_dataset(spec["profile"], spec["payload"])
    _peers.write_shardkit(ds, _common.fresh_dir(spec["out"]), spec["shard_bytes"])


def contenders(
    server: Server,
    shards: str,
    work: str,
    nbytes: int,
    *,
    peers: bool,
    old: tuple[str, dict[str, Any]] | None,
) -> list[Any]:
    """The many-shard contenders: shardkit with its cache; 2 ranks x 2 workers sharing one
    cache (this code, and ``old = (checkout, data set spec)``: that code on the same data
    set written by its own writer, served from ``old/``); with ``peers``, webdataset
    (streaming, and with its cache_dir) and the local limits."""
    import _readers

    tars = sorted(glob.glob(os.path.join(shards, "*.tar")))
    urls = [server.url(os.path.basename(t)) for t in tars]
    base = {"kind": "epochs", "epochs": 2}
    manifest = server.url("manifest.json")
    sk = {**base, "impl": "shardkit", "source": manifest, "cache": os.path.join(work, "sk-cache")}
    out: list[Any] = [("shardkit http+cache", _go(server, sk, nbytes))]
    ranks = {"kind": "epochs", "epochs": 1, "impl": "shardkit", "source": manifest}
    ranks["cache"] = os.path.join(work, "ranks-cache")
    out.append((f"{RANKS} (this code)", _go_ranks(server, ranks, nbytes, None)))
    if old is not None:
        old_bytes = write_with(old[0], os.path.join(shards, "old"), old[1])
        old_ranks = {**ranks, "source": server.url("old/manifest.json")}
        out.append((f"{RANKS} (old code)", _go_ranks(server, old_ranks, old_bytes, old[0])))
    if not peers:
        return out
    wds = {**base, "impl": "webdataset", "urls": urls}
    local = {**base, "impl": "shardkit local", "source": os.path.join(shards, "manifest.json")}
    return [
        *out,
        ("webdataset http", _go(server, wds, nbytes)),
        (
            "webdataset http+cache_dir",
            _go(server, {**wds, "cache": os.path.join(work, "wds-cache")}, nbytes),
        ),
        ("shardkit local", _go(server, local, nbytes)),
        ("raw read (local)", lambda: _readers.read_raw(tars)),
    ]


def big_contenders(server: Server, shards: str, work: str, nbytes: int) -> list[Any]:
    """One big shard, batches of 16: no cache, the cache, webdataset's one stream."""
    tars = sorted(glob.glob(os.path.join(shards, "*.tar")))
    urls = [server.url(os.path.basename(t)) for t in tars]
    base = {"kind": "epochs", "epochs": 2, "batch": 16}
    sk = {**base, "impl": "shardkit", "source": server.url("manifest.json")}
    return [
        ("shardkit http (no cache)", _go(server, sk, nbytes)),
        (
            "shardkit http+cache",
            _go(server, {**sk, "cache": os.path.join(work, "sk-cache")}, nbytes),
        ),
        ("webdataset http", _go(server, {**base, "impl": "webdataset", "urls": urls}, nbytes)),
    ]


def report_big(series: dict[str, Any], n: int, nbytes: int) -> tuple[str, dict[str, Any]]:
    from _common import fmt, table

    rows, out = [], {}
    for name, s in series.items():
        if any(c != [n, n] for c in s.extra["samples"]):
            raise RuntimeError(f"{name} read {s.extra['samples']} samples, expected {n} a epoch")
        tenth = _med([x for x in s.extra["epoch1_tenth_batch_s"] if x is not None] or [0.0])
        e1, e2 = _med(s.extra["epoch1_s"]), _med(s.extra["epoch2_s"])
        out[name] = {
            "tenth_batch_s": tenth,
            "epoch1_s": e1,
            "epoch2_s": e2,
            "epoch1_mb_per_s": nbytes / e1 / 1e6,
            "epoch2_requests": s.extra["epoch2_requests"][-1],
            "runs": {k: v for k, v in s.extra.items() if k.endswith("_s")},
        }
        rows.append(
            [
                name,
                fmt(tenth, ".2f"),
                fmt(e1, ".2f"),
                fmt(nbytes / e1 / 1e6),
                fmt(e2, ".2f"),
                _req(s.extra["epoch2_requests"]),
            ]
        )
    head = ["one shard, 2 workers, batch 16", "10th batch s", "epoch 1 s", "epoch 1 MB/s"]
    head += ["epoch 2 s", "requests epoch 2"]
    cache, plain = out["shardkit http+cache"], out["shardkit http (no cache)"]
    goals = {
        "tenth_batch_cache_over_no_cache": cache["tenth_batch_s"] / plain["tenth_batch_s"],
        "epoch1_cache_over_webdataset": cache["epoch1_s"] / out["webdataset http"]["epoch1_s"],
        "epoch2_requests_cache": cache["epoch2_requests"]["total"],
    }
    text = table(head, rows) + (
        f"\n\n10th batch, cache / no cache: {goals['tenth_batch_cache_over_no_cache']:.2f}x"
        " (goal <= 1.5); first epoch, cache / webdataset: "
        f"{goals['epoch1_cache_over_webdataset']:.2f}x (goal <= 0.6); requests in epoch 2 "
        f"with the cache: {goals['epoch2_requests_cache']} (goal 0)\n"
    )
    return text, {"contenders": out, "goals": goals}


def _med(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def _req(reqs: list[dict[str, int]]) -> str:
    r = reqs[-1]  # request counts are deterministic per run; the last one is shown
    parts = [f"{r[k]} {k}" for k in ("manifest", "index", "shard", "other") if r[k]]
    return f"{r['total']}" + (f" ({', '.join(parts)})" if parts else "")


def report(series: dict[str, Any], n: int, nbytes: int, cap: float) -> tuple[str, list[Any]]:
    from _common import fmt, table

    local_s = series.get("shardkit local")
    local = _med(local_s.extra["epoch2_s"]) if local_s is not None else None
    rows, records = [], []
    for name, s in series.items():
        if name.startswith(RANKS):
            continue
        if name.startswith("raw"):
            rate = nbytes / s.median / 1e6
            rows.append([name, "-", fmt(rate), "-", "-", "-", "-", "-", "-", "-"])
            records.append({"name": name, "mb_per_s": rate, "seconds": s.seconds})
            continue
        if any(c != [n, n] for c in s.extra["samples"]):
            raise RuntimeError(f"{name} read {s.extra['samples']} samples, expected {n} a epoch")
        e1, e2 = _med(s.extra["epoch1_s"]), _med(s.extra["epoch2_s"])
        rec = {
            "name": name,
            "epoch1_s": e1,
            "epoch2_s": e2,
            "epoch1_samples_per_s": n / e1,
            "epoch1_mb_per_s": nbytes / e1 / 1e6,
            "epoch1_pct_of_cap": nbytes / e1 / cap * 100,
            "epoch2_samples_per_s": n / e2,
            "epoch2_pct_of_local": local / e2 * 100 if local else None,
            "startup_requests": s.extra["startup_requests"][-1],
            "epoch1_requests": s.extra["epoch1_requests"][-1],
            "epoch2_requests": s.extra["epoch2_requests"][-1],
            "runs": {k: v for k, v in s.extra.items() if k.endswith("_s")},
        }
        records.append(rec)
        rows.append(
            [
                name,
                fmt(n / e1),
                fmt(nbytes / e1 / 1e6),
                fmt(rec["epoch1_pct_of_cap"], ".0f") + "%",
                fmt(n / e2),
                fmt(rec["epoch2_pct_of_local"], ".0f") + "%" if local else "-",
                _req(s.extra["startup_requests"]),
                _req(s.extra["epoch1_requests"]),
                _req(s.extra["epoch2_requests"]),
                fmt(e1, ".2f") + " / " + fmt(e2, ".2f"),
            ]
        )
    head = ["2 workers, batch 32", "epoch 1 samples/s", "epoch 1 MB/s", "% of cap"]
    head += ["epoch 2 samples/s", "% of local", "requests before 1st batch"]
    head += ["requests epoch 1", "requests epoch 2", "epoch s (1 / 2)"]
    text = table(head, rows)
    cached = next((r for r in records if r["name"] == "shardkit http+cache"), None)
    if cached is not None:
        text += (
            f"\n\nfirst epoch through the cache: {cached['epoch1_pct_of_cap']:.0f}% of the "
            "server's total cap (goal >= 95)"
        )
    ranks_text, ranks = report_ranks(series, nbytes, cap)
    return text + ("\n\n" + ranks_text if ranks else ""), records + ranks


def report_ranks(series: dict[str, Any], nbytes: int, cap: float) -> tuple[str, list[Any]]:
    """The first epoch of 2 ranks x 2 workers on one cache, per code measured."""
    from _common import fmt, table

    rows, records = [], []
    for name, s in series.items():
        if not name.startswith(RANKS):
            continue
        e1 = _med(s.extra["epoch1_s"])
        reqs = s.extra["requests"]
        rec = {
            "name": name,
            "epoch1_s": e1,
            "start_to_end_s": _med(s.extra["start_to_end_s"]),
            "epoch1_pct_of_cap": nbytes / e1 / cap * 100,
            "samples": s.extra["samples"][-1],
            "requests": reqs[-1],
            "fetched_over_shard_bytes": _med([r["bytes"] / nbytes for r in reqs]),
            "runs": {k: v for k, v in s.extra.items() if k.endswith("_s")},
        }
        records.append(rec)
        rows.append(
            [
                name,
                fmt(e1, ".2f"),
                fmt(rec["start_to_end_s"], ".2f"),
                fmt(nbytes / e1 / 1e6),
                fmt(rec["epoch1_pct_of_cap"], ".0f") + "%",
                _req(reqs),
                fmt(rec["fetched_over_shard_bytes"], ".2f"),
            ]
        )
    head = ["first epoch, 2 ranks x 2 workers, one cache dir", "epoch 1 s", "start to end s"]
    head += ["MB/s", "% of cap", "requests", "bytes fetched / shard bytes"]
    return table(head, rows), records


def _part(
    args: Any,
    name: str,
    profile: str,
    payload: int,
    shard_bytes: int,
    caps: tuple[float, float],
    make: Any,
) -> tuple[Any, int, dict[str, Any]]:
    """Write ``payload`` bytes of ``profile`` in shards, serve them under ``caps`` (total,
    per connection) and run the contenders ``make(server, shards, work, nbytes)``
    interleaved; the data set, its shard bytes and the series."""
    import _common
    import _peers

    ds = _common.make_dataset(profile, payload)
    work = os.path.join(args.work, name, profile)
    shards = _common.fresh_dir(os.path.join(work, "shards"))
    _peers.write_shardkit(ds, shards, shard_bytes)
    nbytes = sum(os.path.getsize(t) for t in glob.glob(os.path.join(shards, "*.tar")))
    _common.log(f"{name}: {_common.describe(ds)}, {nbytes / 1e6:.0f} MB of shards")
    server = Server(shards, args.latency, *caps)
    try:
        cons = make(server, shards, work, nbytes)
        series = _common.interleave(args.repeats, cons, before=_common.sync)
    finally:
        server.close()
    return ds, nbytes, series


def main() -> None:
    import _common

    from shardkit.units import parse_size

    p = _common.base_parser(__doc__.split("\n\n")[0])
    p.set_defaults(shard_size="64MB")
    p.add_argument("--latency", type=float, default=0.02, help="seconds added per request")
    p.add_argument("--bandwidth", default="40MB", help="server bytes/s for all connections")
    p.add_argument("--per-connection", default="12MB", help="server bytes/s per connection")
    p.add_argument("--big-size", default="256MB", help="payload of the one-shard run (0: skip)")
    p.add_argument("--big-bandwidth", default="200MB", help="total cap of the one-shard run")
    p.add_argument("--no-peers", action="store_true", help="many shards: shardkit only")
    p.add_argument(
        "--old-code", help="a checkout of an older shardkit: its 2 ranks x 2 workers too"
    )
    args = p.parse_args()
    _common.parse_common(args)
    cap, conn = parse_size(args.bandwidth), parse_size(args.per_connection)
    big, big_cap = parse_size(args.big_size), parse_size(args.big_bandwidth)
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    results.update(latency_s=args.latency, bandwidth_bytes_per_s=cap)
    results.update(per_connection_bytes_per_s=conn, big_size=big, big_bandwidth=big_cap)
    results.update(old_code=_old_commit(args.old_code))
    texts = []
    how = f"{args.latency * 1000:.0f} ms/request, {args.per_connection}/s per connection"
    for profile in args.profile_list:
        rec: dict[str, Any] = {}
        results["profiles"][profile] = rec
        if big:
            caps = (big_cap, conn)
            ds, nbytes, series = _part(
                args, "remote-big", profile, big, 4 * big, caps, big_contenders
            )
            text, rec["one_shard"] = report_big(series, len(ds.samples), nbytes)
            title = f"remote, one shard of {nbytes / 1e6:.0f} MB, {_common.describe(ds)}"
            texts.append(f"### {title}, {how}, {args.big_bandwidth}/s in all\n\n{text}")

        spec = {"profile": profile, "payload": args.size_bytes, "shard_bytes": args.shard_bytes}
        many = functools.partial(
            contenders,
            peers=not args.no_peers,
            old=(args.old_code, spec) if args.old_code else None,
        )

        ds, nbytes, series = _part(
            args, "remote", profile, args.size_bytes, args.shard_bytes, (cap, conn), many
        )
        text, records = report(series, len(ds.samples), nbytes, cap)
        title = f"remote, {_common.describe(ds)}, {nbytes / 1e6:.0f} MB of shards"
        texts.append(f"### {title}, {how}, cap {args.bandwidth}/s in all\n\n{text}\n")
        rec.update(samples=len(ds.samples), shard_bytes=nbytes, contenders=records)
    note = f"medians of {args.repeats}; local reads are warm page-cache reads"
    if args.old_code:
        note += f"; old code: {results['old_code']}"
    _common.finish(args.out, "remote", results, texts, note)


def _old_commit(code: str | None) -> str | None:
    if not code:
        return None
    proc = subprocess.run(
        ["git", "-C", code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return f"{code} at {proc.stdout.strip() or '?'}"


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--write":
        _write(json.loads(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--client":
        print(json.dumps(client(json.loads(sys.argv[2]))), flush=True)
    else:
        main()
