"""Batches into a CUDA device (issue 30 item 6): the loader against the copy's own limit.

For two profiles, ``image`` (a 224x224x3 uint8 array, 150,528 bytes, and a class) and
``llm`` (a json record + 256-1800 int32 tokens, decoded), in batches of 32, each through a
``WebLoader`` over a ``ShardDataset`` of shards written here, with ``pin_memory=True``:

- ``raw pinned``: a pinned host tensor of a batch's bytes copied with
  ``.to("cuda", non_blocking=True)``, once per batch of an epoch, then synchronize: the limit;
- ``raw pageable``: the same from unpinned memory, for contrast;

and for each worker count of ``--workers`` (0: the work in the training process):

- ``loader wN``: the loader's epoch alone (pinned batches, nothing moved);
- ``->cuda each wN``: the same with every tensor of every batch moved with
  ``.to("cuda", non_blocking=True)`` and ``torch.cuda.synchronize()`` at the end;
- ``->cuda to_device wN``: the same moved with ``shardkit.to_device(batch, "cuda")``: one
  copy per buffer the batch's tensors share (a batch of 32 token arrays is one buffer),
  checked equal to the per-tensor move on the warm-up epoch's first batches.

Before timing, each worker count's first pinned batches are checked against an unpinned
loader's: the same values and types, every tensor pinned.

Reported: samples/s, GB/s into the device and its share of ``raw pinned``, and how many of
the batches' tensors (and bytes) came out pinned. Runs are interleaved, medians of
``--repeats``; the loader's worker processes are kept across epochs (a first epoch warms
them, untimed). Without a CUDA device the script still builds small shards and runs the
loader once per worker count with ``pin_memory=False`` and ``to_device(batch, "cpu",
copy=True)`` (so it is tested anywhere), prints one line saying there is no device, writes
``--out`` and exits 0.

    python scripts/bench/gpu.py --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import environment, fmt, interleave, log, table  # noqa: E402

import shardkit  # noqa: E402
from shardkit.units import parse_size  # noqa: E402

BATCH = 32
IMAGE = (224, 224, 3)  # 150,528 bytes: the 150 KB image-like sample
POOL = 64  # distinct payloads, reused cyclically


def _sample(profile: str, i: int, rng: np.random.Generator, pool: list[Any]) -> dict[str, Any]:
    if profile == "image":
        return {"__key__": f"i{i:08d}", "img.npy": pool[i % POOL], "cls": i % 1000}
    tokens = pool[i % POOL][: int(rng.integers(256, 1801))]
    record = {"id": i, "url": f"https://example.org/doc/{i}", "tokens": len(tokens)}
    return {"__key__": f"d{i:08d}", "json": record, "tokens.npy": tokens}


def build(work: str, profile: str, size: int) -> tuple[str, int]:
    """About ``size`` payload bytes of ``profile`` in 16 MB shards, written once:
    (the manifest's path, the number of samples)."""
    rng = np.random.default_rng(0)
    if profile == "image":
        pool = [rng.integers(0, 256, size=IMAGE, dtype=np.uint8) for _ in range(POOL)]
        n = max(BATCH, size // 150_600)
    else:
        pool = [rng.integers(0, 128_000, size=1800, dtype=np.int32) for _ in range(POOL)]
        n = max(BATCH, size // 4_200)  # 1,028 tokens on average, and the record
    out = os.path.join(work, f"{profile}-{n}")
    manifest = os.path.join(out, "manifest.json")
    if not os.path.exists(manifest):
        t = time.perf_counter()
        with shardkit.ShardWriter(out, maxsize=16_000_000) as w:
            for i in range(n):
                w.write(_sample(profile, i, rng, pool))
        log(f"{profile}: wrote {n:,} samples in {time.perf_counter() - t:.1f} s")
    return manifest, n


def tensors(x: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a batch (dicts, lists and tuples walked)."""
    return (v for v in leaves(x) if isinstance(v, torch.Tensor))


def loader(manifest: str, workers: int, pin: bool) -> shardkit.WebLoader:
    ds = shardkit.ShardDataset(manifest).decode().batched(BATCH)
    return shardkit.WebLoader(ds, num_workers=workers, pin_memory=pin)


def epoch(ld: shardkit.WebLoader, device: str | None, move: str = "each") -> dict[str, int]:
    """One epoch; with ``device`` every tensor is moved there without blocking, ``move``
    ``"each"`` tensor by itself or by ``"to_device"``."""
    n = nbytes = count = pinned = pinned_bytes = batches = 0
    for batch in ld:
        batches += 1
        n += len(batch["__key__"])
        for t in tensors(batch):
            count += 1
            nbytes += t.nbytes
            if t.is_pinned():
                pinned += 1
                pinned_bytes += t.nbytes
            if device is not None and move == "each":
                t.to(device, non_blocking=True)
        if device is not None and move == "to_device":
            shardkit.to_device(batch, device)
    if device is not None:
        torch.cuda.synchronize()
    names = ("samples", "bytes", "batches", "tensors", "pinned", "pinned_bytes")
    return dict(zip(names, (n, nbytes, batches, count, pinned, pinned_bytes), strict=True))


def same_moves(ld: shardkit.WebLoader, device: str, batches: int = 8) -> int:
    """The first ``batches`` batches moved by ``to_device`` and tensor by tensor compared:
    how many tensors were compared (a difference ends the run)."""
    checked = 0
    for i, batch in enumerate(ld):
        if i == batches:
            break
        one = list(tensors(shardkit.to_device(batch, device, copy=device == "cpu")))
        each = [t.to(device) for t in tensors(batch)]
        for a, b in zip(one, each, strict=True):
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                raise SystemExit(f"to_device differs from .to on batch {i}: {a} vs {b}")
            checked += 1
    return checked


def leaves(x: Any) -> Iterator[Any]:
    """Every value of a batch that is not a dict, list or tuple, in order."""
    if isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    elif isinstance(x, list | tuple):
        for v in x:
            yield from leaves(v)
    else:
        yield x


def same_as_unpinned(manifest: str, workers: int, pinned: shardkit.WebLoader) -> int:
    """The pinned loader's first batches against an unpinned one's of the same worker count:
    the same values and types, every tensor pinned (how many values were compared)."""
    checked = 0
    plain = loader(manifest, workers, pin=False)
    for i, (a, b) in enumerate(zip(pinned, plain, strict=False)):
        if i == 8:
            break
        for x, y in zip(leaves(a), leaves(b), strict=True):
            same = type(x) is type(y) and (
                torch.equal(x, y) and x.is_pinned() if isinstance(x, torch.Tensor) else x == y
            )
            if not same:
                raise SystemExit(f"w{workers} batch {i}: pinned {x!r} where unpinned {y!r}")
            checked += 1
    return checked


def copies(nbytes: int, times: int, pin: bool) -> Callable[[], dict[str, int]]:
    """``times`` copies of ``nbytes`` from one host tensor (pinned or not) into the device."""
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    src = src.pin_memory() if pin else src

    def run() -> dict[str, int]:
        for _ in range(times):
            src.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        return {"bytes": nbytes * times}

    run()  # the first copy sets up the context and the caching allocator
    return run


def profile_run(manifest: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    loaders = {w: loader(manifest, w, pin=True) for w in args.workers}
    checked = {w: same_moves(ld, "cuda") for w, ld in loaders.items()}
    as_unpinned = {w: same_as_unpinned(manifest, w, ld) for w, ld in loaders.items()}
    warm = {w: epoch(ld, "cuda") for w, ld in loaders.items()}  # workers, pinned blocks
    first = warm[args.workers[0]]
    per_batch = first["bytes"] // first["batches"]
    contenders: list[tuple[str, Callable[[], dict[str, int]]]] = [
        ("raw pinned", copies(per_batch, first["batches"], pin=True)),
        ("raw pageable", copies(per_batch, first["batches"], pin=False)),
    ]
    for w, ld in loaders.items():
        contenders += [
            (f"loader w{w}", lambda ld=ld: epoch(ld, None)),
            (f"->cuda each w{w}", lambda ld=ld: epoch(ld, "cuda")),
            (f"->cuda to_device w{w}", lambda ld=ld: epoch(ld, "cuda", "to_device")),
        ]
    series = interleave(args.repeats, contenders, before=lambda: None)
    raw = series["raw pinned"]
    raw_gbs = raw.extra["bytes"][-1] / raw.median / 1e9
    records, rows = [], []
    for name, s in series.items():
        med, extra = s.median, s.extra
        gbs = extra["bytes"][-1] / med / 1e9
        sps = extra["samples"][-1] / med if "samples" in extra else None
        share = None if "samples" not in extra else extra["pinned"][-1] / extra["tensors"][-1]
        records.append(
            {
                "name": name,
                "median_s": med,
                "seconds": s.seconds,
                "gb_per_s": gbs,
                "pct_of_raw_pinned": gbs / raw_gbs * 100,
                "samples_per_s": sps,
                "pinned_tensor_share": share,
                **{k: v[-1] for k, v in extra.items() if k != "cpu_s"},
            }
        )
        pct = fmt(gbs / raw_gbs * 100, ".0f") + "%"
        pinned = "-" if share is None else f"{share:.0%}"
        rows.append([name, fmt(med, ".3f"), fmt(sps), fmt(gbs, ".2f"), pct, pinned])
    info = {
        "batch_bytes": per_batch,
        "batches": first["batches"],
        "samples": first["samples"],
        "tensors_per_batch": first["tensors"] / first["batches"],
        "to_device_checked_tensors": checked,
        "pinned_checked_values": as_unpinned,
        "contenders": records,
    }
    return info, rows


def no_device(manifests: dict[str, tuple[str, int]], args: argparse.Namespace) -> dict[str, Any]:
    """The CPU side alone: one epoch of each profile's loader per worker count, nothing
    pinned, every batch also copied by ``to_device`` to the CPU and compared."""
    out: dict[str, Any] = {}
    for profile, (manifest, n) in manifests.items():
        for w in args.workers:
            t = time.perf_counter()
            ld = loader(manifest, w, pin=False)
            got = epoch(ld, None)
            if got["samples"] != n or got["tensors"] == 0 or got["pinned"]:
                raise SystemExit(
                    f"{profile}: {got} from {n} samples: the loader's CPU side is wrong"
                )
            checked = same_moves(ld, "cpu")
            out[f"{profile} w{w}"] = {
                **got,
                "to_device_checked": checked,
                "seconds": time.perf_counter() - t,
            }
    return out


def save(path: str, result: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu.json", help="the JSON result file")
    p.add_argument("--work", default="bench-out/data/gpu", help="scratch directory for shards")
    p.add_argument(
        "--size",
        default="",
        help="payload bytes per profile with CUDA (default: image 1GB, llm 256MB)",
    )
    p.add_argument("--repeats", type=int, default=5, help="repetitions (medians reported)")
    p.add_argument("--workers", default="0,2", help="comma list of loader worker processes")
    p.add_argument("--profiles", default="image,llm", help="comma list: image,llm")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    args.workers = [int(w) for w in args.workers.split(",")]
    sizes = {"image": 1_000_000_000, "llm": 256_000_000}
    if args.size:
        sizes = dict.fromkeys(sizes, parse_size(args.size))
    if not cuda:  # no device: a check
        sizes = dict.fromkeys(sizes, 4_000_000)
    profiles = [x.strip() for x in args.profiles.split(",") if x.strip()]
    if not profiles or set(profiles) - {"image", "llm"} or args.repeats < 1:
        raise SystemExit("--profiles takes image,llm and --repeats at least 1")
    os.makedirs(args.work, exist_ok=True)
    manifests = {pr: build(args.work, pr, sizes[pr]) for pr in profiles}
    result: dict[str, Any] = {
        "benchmark": "gpu",
        "env": environment(),
        "batch": BATCH,
        "workers": args.workers,
        "repeats": args.repeats,
        "payload_bytes": {pr: sizes[pr] for pr in profiles},
    }
    if not cuda:
        result.update(device=None, cpu_side=no_device(manifests, args))
        save(args.out, result)
        print(
            f"no CUDA device (torch {torch.__version__}): nothing measured; the CPU side "
            f"(shards built, loader with pin_memory=False) ran; JSON: {args.out}"
        )
        return
    result["device"] = torch.cuda.get_device_name()
    texts = []
    for profile, (manifest, _n) in manifests.items():
        log(f"{profile}: {args.repeats} repetitions on {result['device']}")
        info, rows = profile_run(manifest, args)
        result[profile] = info
        head = ["contender", "median s", "samples/s", "GB/s", "of raw pinned", "pinned"]
        texts.append(
            f"\n{profile}: {info['samples']:,} samples, {info['batches']} batches of "
            f"{info['batch_bytes']:,} bytes ({info['tensors_per_batch']:.1f} tensors)"
        )
        texts.append(table(head, rows))
    save(args.out, result)
    load = statistics.mean(os.getloadavg())
    print("\n".join(texts))
    print(
        f"({result['device']}; medians of {args.repeats}; workers {args.workers}; "
        f"load {load:.1f} on {os.cpu_count()} CPUs; JSON: {args.out})"
    )


if __name__ == "__main__":
    main()
