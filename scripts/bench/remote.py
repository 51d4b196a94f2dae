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
  below, the first epoch set against the server's total cap.

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


def contenders(server: Server, shards: str, work: str, nbytes: int) -> list[Any]:
    import _readers
    from _common import fresh_dir

    tars = sorted(glob.glob(os.path.join(shards, "*.tar")))
    urls = [server.url(os.path.basename(t)) for t in tars]
    base = {"kind": "epochs", "epochs": 2}

    def go(spec: dict[str, Any]) -> Any:
        def run() -> dict[str, Any]:
            if "cache" in spec:
                fresh_dir(spec["cache"])
            return measure(server, spec, nbytes)

        return run

    return [
        (
            "shardkit http+cache",
            go(
                {
                    **base,
                    "impl": "shardkit",
                    "source": server.url("manifest.json"),
                    "cache": os.path.join(work, "sk-cache"),
                }
            ),
        ),
        ("webdataset http", go({**base, "impl": "webdataset", "urls": urls})),
        (
            "webdataset http+cache_dir",
            go(
                {
                    **base,
                    "impl": "webdataset",
                    "urls": urls,
                    "cache": os.path.join(work, "wds-cache"),
                }
            ),
        ),
        (
            "shardkit local",
            go({**base, "impl": "shardkit local", "source": os.path.join(shards, "manifest.json")}),
        ),
        ("raw read (local)", lambda: _readers.read_raw(tars)),
    ]


def big_contenders(server: Server, shards: str, work: str, nbytes: int) -> list[Any]:
    """One big shard, batches of 16: no cache, the cache, webdataset's one stream."""
    from _common import fresh_dir

    tars = sorted(glob.glob(os.path.join(shards, "*.tar")))
    urls = [server.url(os.path.basename(t)) for t in tars]
    base = {"kind": "epochs", "epochs": 2, "batch": 16}
    manifest = server.url("manifest.json")

    def go(spec: dict[str, Any]) -> Any:
        def run() -> dict[str, Any]:
            if "cache" in spec:
                fresh_dir(spec["cache"])
            return measure(server, spec, nbytes)

        return run

    cache = os.path.join(work, "sk-cache")
    return [
        ("shardkit http (no cache)", go({**base, "impl": "shardkit", "source": manifest})),
        (
            "shardkit http+cache",
            go({**base, "impl": "shardkit", "source": manifest, "cache": cache}),
        ),
        ("webdataset http", go({**base, "impl": "webdataset", "urls": urls})),
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

    local = _med(series["shardkit local"].extra["epoch2_s"])
    rows, records = [], []
    for name, s in series.items():
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
            "epoch2_pct_of_local": local / e2 * 100,
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
                fmt(rec["epoch2_pct_of_local"], ".0f") + "%",
                _req(s.extra["startup_requests"]),
                _req(s.extra["epoch1_requests"]),
                _req(s.extra["epoch2_requests"]),
                fmt(e1, ".2f") + " / " + fmt(e2, ".2f"),
            ]
        )
    head = ["2 workers, batch 32", "epoch 1 samples/s", "epoch 1 MB/s", "% of cap"]
    head += ["epoch 2 samples/s", "% of local", "requests before 1st batch"]
    head += ["requests epoch 1", "requests epoch 2", "epoch s (1 / 2)"]
    return table(head, rows), records


def main() -> None:
    import _common
    import _peers

    from shardkit.units import parse_size

    p = _common.base_parser(__doc__.split("\n\n")[0])
    p.set_defaults(shard_size="64MB")
    p.add_argument("--latency", type=float, default=0.02, help="seconds added per request")
    p.add_argument("--bandwidth", default="40MB", help="server bytes/s for all connections")
    p.add_argument("--per-connection", default="12MB", help="server bytes/s per connection")
    p.add_argument("--big-size", default="256MB", help="payload of the one-shard run (0: skip)")
    p.add_argument("--big-bandwidth", default="200MB", help="total cap of the one-shard run")
    args = p.parse_args()
    _common.parse_common(args)
    cap, conn = parse_size(args.bandwidth), parse_size(args.per_connection)
    big, big_cap = parse_size(args.big_size), parse_size(args.big_bandwidth)
    results: dict[str, Any] = {"size": args.size, "repeats": args.repeats, "profiles": {}}
    results.update(latency_s=args.latency, bandwidth_bytes_per_s=cap)
    results.update(per_connection_bytes_per_s=conn, big_size=big, big_bandwidth=big_cap)
    texts = []
    for profile in args.profile_list:
        rec: dict[str, Any] = {}
        results["profiles"][profile] = rec
        if big:
            ds = _common.make_dataset(profile, big)
            work = os.path.join(args.work, "remote-big", profile)
            shards = _common.fresh_dir(os.path.join(work, "shards"))
            _peers.write_shardkit(ds, shards, 4 * big)
            nbytes = sum(os.path.getsize(t) for t in glob.glob(os.path.join(shards, "*.tar")))
            _common.log(f"remote, one shard: {_common.describe(ds)}, {nbytes / 1e6:.0f} MB")
            server = Server(shards, args.latency, big_cap, conn)
            try:
                cons = big_contenders(server, shards, work, nbytes)
                series = _common.interleave(args.repeats, cons, before=_common.sync)
            finally:
                server.close()
            text, rec["one_shard"] = report_big(series, len(ds.samples), nbytes)
            title = f"remote, one shard of {nbytes / 1e6:.0f} MB, {_common.describe(ds)}"
            texts.append(
                f"### {title}, {args.latency * 1000:.0f} ms/request, "
                f"{args.per_connection}/s per connection, {args.big_bandwidth}/s in all\n\n{text}"
            )
        ds = _common.make_dataset(profile, args.size_bytes)
        work = os.path.join(args.work, "remote", profile)
        shards = _common.fresh_dir(os.path.join(work, "shards"))
        _peers.write_shardkit(ds, shards, args.shard_bytes)
        nbytes = sum(os.path.getsize(t) for t in glob.glob(os.path.join(shards, "*.tar")))
        _common.log(f"remote: {_common.describe(ds)}, {nbytes / 1e6:.0f} MB of shards")
        server = Server(shards, args.latency, cap, conn)
        try:
            cons = contenders(server, shards, work, nbytes)
            series = _common.interleave(args.repeats, cons, before=_common.sync)
        finally:
            server.close()
        text, records = report(series, len(ds.samples), nbytes, cap)
        title = f"remote, {_common.describe(ds)}, {nbytes / 1e6:.0f} MB of shards"
        texts.append(
            f"### {title}, {args.latency * 1000:.0f} ms/request, "
            f"{args.per_connection}/s per connection, cap {args.bandwidth}/s in all\n\n{text}\n"
        )
        rec.update(samples=len(ds.samples), shard_bytes=nbytes, contenders=records)
    note = f"medians of {args.repeats}; local reads are warm page-cache reads"
    _common.finish(args.out, "remote", results, texts, note)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--client":
        print(json.dumps(client(json.loads(sys.argv[2]))), flush=True)
    else:
        main()
