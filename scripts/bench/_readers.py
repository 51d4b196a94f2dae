"""The readers read.py times: in-process readers and the loader / RSS / resume children.

In-process readers return ``{"samples": n, "bytes": b}``. Children run in a fresh interpreter (one
per measurement, started by read.py with ``--child SPEC``) so that every loader starts
from the same state (no shared memory or worker pool left over from the previous one) and
its peak RSS is its own; they print one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterable, Iterator
from typing import Any

_CHUNK = 1 << 20


# -- in-process, raw samples (no decode) -------------------------------------------------
def read_raw(paths: list[str]) -> dict[str, int]:
    """Plain sequential read of the files, a new 1 MB bytes object per read (the limit)."""
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while data := f.read(_CHUNK):
                total += len(data)
    return {"samples": 0, "bytes": total}


def read_raw_into(paths: list[str]) -> dict[str, int]:
    """Sequential readinto one reused 1 MB buffer: no allocation, the buffer stays in cache."""
    buf = bytearray(_CHUNK)
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return {"samples": 0, "bytes": total}


def read_gunzip(paths: list[str]) -> dict[str, int]:
    """Plain sequential gunzip of the files (the limit for a .tar.gz reader)."""
    import gzip

    total = 0
    for p in paths:
        with gzip.open(p, "rb") as f:
            while data := f.read(_CHUNK):
                total += len(data)
    return {"samples": 0, "bytes": total}


def _count(samples: Iterable[Any]) -> int:
    n = 0
    for _ in samples:
        n += 1
    return n


def read_sk_shards(paths: list[str]) -> dict[str, int]:
    """shardkit.read_shard over each file."""
    import shardkit

    return {"samples": sum(_count(shardkit.read_shard(p)) for p in paths)}


def read_sk_dataset(manifest: str, verify: str = "on") -> dict[str, int]:
    """shardkit.ShardDataset over the manifest, in this process (no workers); ``verify``
    "off" reads the shards unverified (``IoConfig.limits.verify``)."""
    import shardkit
    from shardkit.io.config import IoConfig, ReaderLimits

    ds = shardkit.ShardDataset(manifest, io=IoConfig(limits=ReaderLimits(verify=verify)))
    return {"samples": _count(ds)}


def read_wds(urls: list[str]) -> dict[str, int]:
    """webdataset.WebDataset, no decode."""
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    return {"samples": _count(ds)}


def read_wds_tar(urls: list[str]) -> dict[str, int]:
    """webdataset's bare pipeline: shard list → tarfile_to_samples."""
    import webdataset as wds

    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    return {"samples": _count(ds)}


# -- loaders (2 workers, batches of 32, decoded samples, each peer in its own format) ---
def _batch_len(batch: Any) -> int:
    """Samples in a collated batch: a dict or tuple of columns, a list, an array."""
    if isinstance(batch, dict):
        cols = [v for v in batch.values() if not isinstance(v, (bytes, str, memoryview))]
        return _batch_len(cols[0])
    if isinstance(batch, tuple):
        return _batch_len(batch[0])
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0])
    return len(batch)


def _drain(loader: Iterable[Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples += _batch_len(batch)
    return {"seconds": time.perf_counter() - t0, "samples": samples, "first_batch_s": first}


def loader_shardkit(spec: dict[str, Any]) -> Iterable[Any]:
    import shardkit
    from shardkit.io.config import IoConfig, ReaderLimits

    io = IoConfig(limits=ReaderLimits(verify=spec.get("verify", "on")))
    ds = shardkit.ShardDataset(spec["manifest"], io=io).decode().batched(spec["batch"])
    mode = spec.get("worker_mode", "process")
    extra = {"persistent_workers": spec["persistent"]} if "persistent" in spec else {}
    return shardkit.WebLoader(ds, num_workers=spec["workers"], worker_mode=mode, **extra)


def loader_webdataset(spec: dict[str, Any]) -> Iterable[Any]:
    import webdataset as wds

    ds = (
        wds.WebDataset(spec["urls"], shardshuffle=False, empty_check=False, nodesplitter=None)
        .decode()
        .batched(spec["batch"])
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=spec["workers"])


def loader_mosaic(spec: dict[str, Any]) -> Iterable[Any]:
    import _peers
    from torch.utils.data import DataLoader

    mosaic = _peers.streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = mosaic.StreamingDataset(local=spec["dir"], shuffle=False, batch_size=spec["batch"])
    return DataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"])


def loader_litdata(spec: dict[str, Any]) -> Iterable[Any]:
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(spec["dir"])
    extra = {"persistent_workers": spec["persistent"]} if "persistent" in spec else {}
    return StreamingDataLoader(
        ds,
        batch_size=spec["batch"],
        num_workers=spec["workers"],
        collate_fn=_litdata_collate,
        **extra,
    )


def _litdata_collate(samples: list[dict[str, Any]]) -> Any:
    """torch's default collate, with litdata's memoryview fields turned into bytes first.

    litdata hands a ``bytes`` field back as a memoryview, which the default collate treats
    as a sequence: one tensor per byte position (150,000 tensors for a 150 KB field, and
    "too many open files" with workers). Given bytes it keeps a list, as for the others.
    """
    from torch.utils.data import default_collate

    fixed = [
        {k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()} for s in samples
    ]
    return default_collate(fixed)


def loader_energon(spec: dict[str, Any]) -> Iterable[Any]:
    import _peer_energon

    return _peer_energon.loader_energon(spec)


def loader_grain(spec: dict[str, Any]) -> Iterable[Any]:
    import _peer_grain

    return _peer_grain.loader_grain(spec)


def loader_spdl(spec: dict[str, Any]) -> Iterable[Any]:
    import _peer_tars

    return _peer_tars.loader_spdl(spec)


def loader_spdl_dataloader(spec: dict[str, Any]) -> Iterable[Any]:
    import _peer_tars

    return _peer_tars.loader_spdl_dataloader(spec)


def loader_torchdata(spec: dict[str, Any]) -> Iterable[Any]:
    import _peer_tars

    return _peer_tars.loader_torchdata(spec)


LOADERS = {
    "shardkit": loader_shardkit,
    "shardkit verify=off": loader_shardkit,
    "shardkit threads": loader_shardkit,
    "shardkit threads verify=off": loader_shardkit,
    "shardkit 0 workers": loader_shardkit,
    "shardkit fresh workers": loader_shardkit,
    "webdataset": loader_webdataset,
    "mosaic": loader_mosaic,
    "litdata": loader_litdata,
    "litdata persistent": loader_litdata,
    "energon": loader_energon,
    "grain": loader_grain,
    "spdl": loader_spdl,
    "spdl DataLoader": loader_spdl_dataloader,
    "torchdata.nodes": loader_torchdata,
}


# -- children ----------------------------------------------------------------------------
def _maxrss_mb() -> float:
    """This process's peak RSS (VmHWM: getrusage's ru_maxrss keeps the parent's peak
    across fork+exec, which would report the harness's own size)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_loader(spec: dict[str, Any]) -> dict[str, Any]:
    """The first epoch of a fresh loader (``seconds``, ``first_batch_s``), then
    ``spec['epochs'] - 1`` more over the same loader (``epoch_seconds``: steady state)."""
    loader = LOADERS[spec["impl"]](spec)
    out = _drain(loader)
    out["epoch_seconds"] = []
    for _ in range(spec.get("epochs", 1) - 1):
        more = _drain(loader)
        if more["samples"] != out["samples"]:
            raise RuntimeError(f"epoch of {more['samples']} samples after {out['samples']}")
        out["epoch_seconds"].append(more["seconds"])
    out["maxrss_mb"] = _maxrss_mb()
    return out


def child_rss(spec: dict[str, Any]) -> dict[str, Any]:
    """Read a data set once in this process; report samples and peak RSS."""
    impl = spec["impl"]
    if impl == "shardkit ShardDataset":
        out = read_sk_dataset(spec["manifest"])
    elif impl == "shardkit read_shard":
        out = read_sk_shards(spec["paths"])
    else:
        out = read_wds(spec["paths"])
    return {"samples": out["samples"], "maxrss_mb": _maxrss_mb()}


def _resume_loader(spec: dict[str, Any]) -> Any:
    import shardkit

    ds = shardkit.ShardDataset(spec["manifest"]).batched(spec["batch"])
    return shardkit.WebLoader(ds, num_workers=spec["workers"])


def child_resume_save(spec: dict[str, Any]) -> dict[str, Any]:
    """Consume ``spec['batches']`` batches and save the loader state to ``spec['state']``."""
    loader = _resume_loader(spec)
    it: Iterator[Any] = iter(loader)
    for _ in range(spec["batches"]):
        next(it)
    state = loader.state_dict()
    with open(spec["state"], "w") as f:
        json.dump(state, f)
    return {"saved": spec["batches"]}


def child_resume_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Time a fresh loader (imports done), load_state_dict, the first batch."""
    import shardkit

    shardkit.WebLoader  # noqa: B018 - the lazy export imports torch: not resume time
    with open(spec["state"]) as f:
        state = json.load(f)
    t0 = time.perf_counter()
    loader = _resume_loader(spec)
    t1 = time.perf_counter()
    loader.load_state_dict(state)
    t2 = time.perf_counter()
    next(iter(loader))
    t3 = time.perf_counter()
    return {"seconds": t3 - t0, "build_s": t1 - t0, "load_s": t2 - t1, "first_batch_s": t3 - t2}


def child_skip(spec: dict[str, Any]) -> dict[str, Any]:
    """webdataset has no resume: reaching position n means reading n samples again."""
    import torch  # noqa: F401 - webdataset imports it too: not re-read time
    import webdataset as wds

    t0 = time.perf_counter()
    ds = wds.WebDataset(spec["urls"], shardshuffle=False, empty_check=False)
    it = iter(ds.batched(spec["batch"]))
    for _ in range(spec["batches"] + 1):
        next(it)
    return {"seconds": time.perf_counter() - t0}


CHILDREN = {
    "loader": child_loader,
    "rss": child_rss,
    "resume-save": child_resume_save,
    "resume-load": child_resume_load,
    "skip": child_skip,
}


def run_child(spec_json: str) -> None:
    spec = json.loads(spec_json)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(CHILDREN[spec["kind"]](spec)), flush=True)
