"""Probes of shardkit's own loader path (no peers: read.py compares with them).

- ``stages``: microseconds per sample of each in-process stage on small samples: reading
  (tar parse and verified read), decoding, collating a batch of 32 (``--against`` too);
- ``epochs``: a WebLoader with 2 worker processes, kept across epochs or fresh each epoch:
  seconds per epoch and the first batch of each epoch;
- ``reads``: microseconds per sample of ``read_shard`` over the files and of a verified
  ``ShardDataset`` over the manifest, in one process, small and medium samples (the best of
  7 passes; ``--against`` too);
- ``rate``: samples/s of ``ShardDataset(...).decode().batched(32)`` through a WebLoader
  with 2 fresh worker processes, and its first batch; with ``--against DIR`` the same
  measured with other checkouts' shardkit (PYTHONPATH=DIR), runs interleaved;
- ``llm``: LLM documents (a json record + 256-1800 int32 tokens, decoded, batches of 32):
  samples/s of 0 workers, 2 worker processes and 2 thread workers (kept across epochs, the
  loader's default), and of litdata's 2 kept workers on the same documents when the bench
  venv is there (``PEER_PYTHON``), each one's first batch, and the CPU microseconds a
  sample of the training process and of the worker processes (what the load does not
  change much);
  ``--against`` too;
- ``transfer``: CPU microseconds a batch of 32 LLM documents costs to cross from a worker
  process, worker side and training side, in one process, alone and in bundles of 16 (as
  worker processes send them, where the checkout has bundles); ``--against`` too;
- ``floor``: CPU microseconds torch's DataLoader itself costs an item with 2 kept worker
  processes (a tiny item), the training process's and the workers';
- ``first``: the first batch of 2 kept worker processes on the LLM documents, from the
  loader's making, and the next epoch's first batch; litdata's beside it (``--against``
  too: e.g. a checkout without ``workers._primed``).

``llm`` also prints what 2 worker processes can give at most on 2 idle cores from the CPU
each mode spends a sample (2 x 0 workers' / all the processes'): 3 processes on 2 cores
share them, so no scheduling does better (the load changes it little).

Every measurement runs in a fresh child process; the figures are medians of ``--runs``.

    PYTHONPATH=. python scripts/bench/loader_probe.py stages reads epochs rate --against /tmp/old
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def make_data(work: str, profile: str) -> str:
    """The profile's shards (80 MB, 16 MB shards), written once; the manifest's path."""
    sys.path.insert(0, HERE)
    import _peers
    from _common import make_dataset

    out = os.path.join(work, profile)
    manifest = os.path.join(out, "manifest.json")
    if not os.path.exists(manifest):
        _peers.write_shardkit(make_dataset(profile, 80_000_000), out, 16_000_000)
    return manifest


LLM_DOCS = 20_000  # ~84 MB: a json record and 256-1800 int32 tokens (1,028 on average)


def llm_docs() -> Any:
    """The LLM documents: (key, json record, int32 tokens), the same in every format."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(LLM_DOCS):
        n = int(rng.integers(256, 1801))
        record = {"id": i, "url": f"https://example.org/doc/{i}", "lang": "en", "tokens": n}
        yield f"d{i:08d}", record, rng.integers(0, 128_000, size=n, dtype=np.int32)


def make_llm(work: str) -> str:
    """The LLM-document shards (16 MB shards), written once; the manifest's path."""
    import shardkit

    out = os.path.join(work, "llm")
    manifest = os.path.join(out, "manifest.json")
    if not os.path.exists(manifest):
        with shardkit.ShardWriter(out, maxsize=16_000_000) as w:
            for key, record, tokens in llm_docs():
                w.write({"__key__": key, "json": record, "tokens.npy": tokens})
    return manifest


def _same(x: Any) -> Any:
    return x


def _litdata_llm(work: str) -> str:
    """The LLM documents in litdata's format (16 MB chunks), written once; the folder."""
    out = os.path.join(work, "llm-litdata")
    if not os.path.exists(os.path.join(out, "index.json")):
        from litdata.streaming.writer import BinaryWriter

        w = BinaryWriter(out, chunk_bytes=16_000_000)
        for i, (key, record, tokens) in enumerate(llm_docs()):
            w[i] = {"__key__": key, "json": record, "tokens.npy": tokens}
        w.done()
        w.merge()
    return out


def child_llm_litdata(work: str, tensors: bool, first_only: bool = False) -> dict[str, float]:
    """litdata (the bench venv's) on the same LLM documents in its own format (16 MB chunks,
    written once here): 2 kept worker processes, batches of 32 laid out as shardkit's (a
    json column dict, a list of token arrays: with ``tensors`` torch tensors, the types
    shardkit hands out, which torch's queue moves one shared segment each; else numpy
    arrays, pickled through the pipe: litdata's cheaper way); the first batch counted from
    the loader's making, as shardkit's is from the WebLoader's (each data set made before)."""
    import torch
    from litdata import StreamingDataLoader, StreamingDataset
    from torch.utils.data import default_collate

    out = _litdata_llm(work)
    tokens = torch.from_numpy if tensors else _same

    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "__key__": [s["__key__"] for s in samples],
            "json": default_collate([s["json"] for s in samples]),
            "tokens.npy": [tokens(s["tokens.npy"]) for s in samples],
        }

    ds = StreamingDataset(out)
    t = time.perf_counter()
    loader = StreamingDataLoader(
        ds, batch_size=32, num_workers=2, collate_fn=collate, persistent_workers=True
    )
    if first_only:  # the first batch, then the next epoch's (no rates)
        return _firsts(loader, t)
    return _first_and_rate(loader, t)


def _firsts(loader: Any, t: float) -> dict[str, float]:
    """Seconds from ``t`` (the loader's making) to its first batch, and from the next
    epoch's ``iter()`` to its first batch (kept workers)."""
    it = iter(loader)
    next(it)
    out = {"first_batch_s": time.perf_counter() - t}
    for _batch in it:
        pass
    t = time.perf_counter()
    it = iter(loader)
    next(it)
    out["next_epoch_first_s"] = time.perf_counter() - t
    for _batch in it:
        pass
    return out


def child_first(manifest: str) -> dict[str, float]:
    """2 kept worker processes on the LLM documents: the first batch from the WebLoader's
    making (the data set made before, as litdata's), and the next epoch's first batch."""
    import shardkit

    ds = shardkit.ShardDataset(manifest).decode().batched(32)
    t = time.perf_counter()
    return _firsts(shardkit.WebLoader(ds, num_workers=2), t)


# -- what a child runs -------------------------------------------------------------------
def child_stages(manifest: str) -> dict[str, float]:
    import shardkit
    from shardkit.stages.collate import collate_numpy
    from shardkit.stages.decode import Decode

    ds = shardkit.ShardDataset(manifest)
    t = time.perf_counter()
    samples = list(ds)
    read = (time.perf_counter() - t) / len(samples)
    dec = Decode(None)  # type: ignore[arg-type]
    dec.decode_sample(samples[0])
    t = time.perf_counter()
    for s in samples:  # as the pipeline does: each decoded sample goes on, none is kept
        dec.decode_sample(s)
    decode = (time.perf_counter() - t) / len(samples)
    decoded = [dec.decode_sample(s) for s in samples[:3200]]
    t = time.perf_counter()
    for i in range(0, len(decoded), 32):
        collate_numpy(decoded[i : i + 32])
    collate = (time.perf_counter() - t) / len(decoded)
    return {"read_us": read * 1e6, "decode_us": decode * 1e6, "collate_us": collate * 1e6}


def _loader(manifest: str, **kwargs: Any) -> Any:
    import shardkit

    ds = shardkit.ShardDataset(manifest).decode().batched(32)
    return shardkit.WebLoader(ds, num_workers=2, **kwargs)


def child_epochs(manifest: str, kept: bool) -> dict[str, float]:
    loader = _loader(manifest, persistent_workers=kept)
    epochs, firsts = [], []
    for _ in range(4):
        t = time.perf_counter()
        it = iter(loader)
        next(it)
        firsts.append(time.perf_counter() - t)
        for _batch in it:
            pass
        epochs.append(time.perf_counter() - t)
    later = epochs[1:]
    return {
        "epoch_s": statistics.median(later),
        "next_first_batch_s": statistics.median(firsts[1:]),
    }


def child_rate(manifest: str) -> dict[str, float]:
    loader = _loader(manifest, persistent_workers=False)  # as in checkouts before kept ones
    return _first_and_rate(loader, time.perf_counter())


def _first_and_rate(loader: Any, t: float, field: str = "__key__") -> dict[str, float]:
    """Seconds from ``t`` (the loader's making) to its first batch; then the median
    samples/s of 3 more epochs (a batch's samples: the length of its ``field``)."""
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t
    for _batch in it:
        pass
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        m = sum(len(b[field]) for b in loader)
        rates.append(m / (time.perf_counter() - t))
    return {"samples_per_s": statistics.median(rates), "first_batch_s": first}


def child_reads(manifest: str) -> dict[str, float]:
    import glob

    import shardkit
    from shardkit.format.tario.reader import read_shard

    paths = sorted(glob.glob(os.path.join(os.path.dirname(manifest), "*.tar")))
    ds = shardkit.ShardDataset(manifest)

    def shards() -> int:
        return sum(1 for p in paths for _ in read_shard(p))

    def dataset() -> int:
        return sum(1 for _ in ds)

    out = {}
    for name, fn in (("read_shard_us", shards), ("dataset_us", dataset)):
        best = float("inf")
        for _ in range(7):
            t = time.perf_counter()
            n = fn()
            best = min(best, (time.perf_counter() - t) / n * 1e6)
        out[name] = best
    return out


def child_llm(manifest: str, mode: str) -> dict[str, float]:
    """``mode``: "0" (no workers), "process" or "thread" (2 workers, kept across epochs);
    the first batch counted from the WebLoader's making."""
    import shardkit

    ds = shardkit.ShardDataset(manifest).decode().batched(32)
    workers = {"num_workers": 0} if mode == "0" else {"num_workers": 2, "worker_mode": mode}
    t = time.perf_counter()
    loader = shardkit.WebLoader(ds, **workers)
    out = _first_and_rate(loader, t)
    # CPU seconds a sample, told apart from the load: the training process's and its
    # worker processes' (the kept ones of the epochs above), over one more epoch
    kept = getattr(loader._loader, "_iterator", None)  # a DataLoader's (threads: none)
    pids = [p.pid for p in getattr(kept, "_workers", [])]
    main, kids = time.process_time(), _cpu(pids)
    n = sum(len(b["__key__"]) for b in loader)
    out["cpu_us_main"] = (time.process_time() - main) / n * 1e6
    out["cpu_us_workers"] = (_cpu(pids) - kids) / n * 1e6
    return out


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def child_transfer(manifest: str) -> dict[str, float]:
    """CPU microseconds a batch of 32 LLM documents costs to cross from a worker process, in
    one process: the worker's packing (into its arena, pickled as its queue does) and the
    training process's taking over (unpickled, views made); the best of 5 passes over 100
    real batches, each batch let go before the next (its slot reused)."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - torch's reductions, as in a worker

    import shardkit
    from shardkit.streaming import arena

    batches = list(itertools.islice(shardkit.ShardDataset(manifest).decode().batched(32), 100))
    packer = arena.WorkerArena(arena.Lanes(1), 0)
    wrap = getattr(arena, "Pickled", None)  # checkouts before it let the queue pickle
    crossing = getattr(packer, "crossing", None)  # as a worker pickles a batch (plain or not)

    def pack(batch: Any) -> bytes:
        if crossing is not None:
            return bytes(ForkingPickler.dumps(crossing(batch)))
        parcel = packer.pack(batch)
        return bytes(ForkingPickler.dumps(parcel if wrap is None else wrap(parcel, 0)))

    for batch in batches[:5]:  # the slots' segments made and known
        arena.take_over(pickle.loads(pack(batch)))
    w, m = _crossing_us(batches, pack, lambda data: arena.take_over(pickle.loads(data)), 1)
    out = {"worker_us_a_batch": w, "training_us_a_batch": m}
    try:  # checkouts with bundles: 16 batches a DataLoader item, as worker processes send them
        from shardkit.streaming import bundles
        from shardkit.streaming.transfer import Pickled
    except ImportError:
        return out
    groups = [tuple(batches[i : i + 16]) for i in range(0, len(batches) - 15, 16)]

    def bundle(group: tuple[Any, ...]) -> bytes:
        body = packer.pack(group)
        packed = bundles.Packed(body, [{"w": 0}] * len(group), 0)
        return bytes(ForkingPickler.dumps(Pickled(packed, 0, plain=packer.plain)))

    for group in groups[:2]:  # the slots' segments made and known at a bundle's size
        pickle.loads(bundle(group)).load().open()
    w, m = _crossing_us(groups, bundle, lambda data: pickle.loads(data).load().open(), 16)
    out.update(bundled_worker_us_a_batch=w, bundled_training_us_a_batch=m)
    return out


def _crossing_us(
    items: list[Any], send: Callable[[Any], bytes], receive: Callable[[bytes], Any], per: int
) -> tuple[float, float]:
    """CPU us a batch of ``send`` (the worker's side) and ``receive`` (the training
    process's) over ``items`` of ``per`` batches each: the least of 5 passes, each side."""
    worker, main = [], []
    for _ in range(5):
        w = m = 0.0
        for item in items:
            t = time.thread_time()
            data = send(item)
            w += time.thread_time() - t
            t = time.thread_time()
            receive(data)
            m += time.thread_time() - t
        worker.append(w / (len(items) * per) * 1e6)
        main.append(m / (len(items) * per) * 1e6)
    return min(worker), min(main)


class _Tiny:  # an IterableDataset (made in the child: torch is imported there)
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        meta = {"w": 0, "s": {"stage": "batched", "version": 1, "n": 3}, "c": {"samples": 32.0}}
        for _ in range(self.n):
            yield ("x", meta)


def child_floor() -> dict[str, float]:
    """CPU microseconds torch's DataLoader itself costs an item with 2 kept worker processes
    (a tiny item and meta: no data set, no transfer), the training process's and the
    workers': what every batch pays before shardkit does anything."""
    from torch.utils.data import DataLoader, IterableDataset

    tiny = type("Tiny", (_Tiny, IterableDataset), {})(5000)
    loader = DataLoader(tiny, batch_size=None, num_workers=2, persistent_workers=True)
    for _ in loader:
        pass
    pids = [p.pid for p in loader._iterator._workers]  # type: ignore[attr-defined]
    main, kids = time.process_time(), _cpu(pids)
    n = sum(1 for _ in loader)
    return {
        "cpu_us_main_an_item": (time.process_time() - main) / n * 1e6,
        "cpu_us_workers_an_item": (_cpu(pids) - kids) / n * 1e6,
    }


CHILDREN = {
    "first": child_first,
    "floor": child_floor,
    "llm_litdata": child_llm_litdata,
    "llm": child_llm,
    "transfer": child_transfer,
    "stages": child_stages,
    "epochs": child_epochs,
    "reads": child_reads,
    "rate": child_rate,
}


PEER_PYTHON = "/work/benchvenv/bin/python"  # scripts/bench/setup.sh's venv: litdata


def run_child(tree: str, kind: str, *args: Any) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    spec = json.dumps([kind, *args])
    code = f"import sys; sys.path.insert(0, {HERE!r}); import loader_probe as p; p.main_child()"
    python = PEER_PYTHON if kind == "llm_litdata" else sys.executable
    out = subprocess.run(  # run in the tree: `-c` puts the working directory first on sys.path
        [python, "-c", code, spec],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main_child() -> None:
    import shardkit

    kind, *args = json.loads(sys.argv[1])
    assert os.path.dirname(os.path.dirname(shardkit.__file__)) == os.getcwd(), shardkit.__file__
    print(json.dumps(CHILDREN[kind](*args)))


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def _interleaved(
    runs: list[tuple[str, tuple[Any, ...]]], repeats: int
) -> list[tuple[str, dict[str, float]]]:
    """Each ``(tree, (probe, *args))`` run ``repeats`` times, interleaved: its medians."""
    rows: list[list[dict[str, float]]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, (tree, spec) in enumerate(runs):
            rows[i].append(run_child(tree, *spec))
    return [
        (tree, {k: round(v, 3) for k, v in _medians(r).items()})
        for (tree, _), r in zip(runs, rows, strict=True)
    ]


def _per_tree(
    probe: str, what: str, trees: list[str], manifests: tuple[str, str], runs: int
) -> None:
    """``probe`` on both profiles, every tree interleaved: its medians, a line each."""
    for name, m in zip(("small", "medium"), manifests, strict=True):
        specs = [(tree, (probe, m)) for tree in trees]
        for tree, med in _interleaved(specs, runs):
            print(f"{probe}, {name}, {what}, {tree}:", med)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("probes", nargs="+", choices=sorted(CHILDREN))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--work", default="/tmp/shardkit-loader-probe")
    p.add_argument("--against", nargs="*", default=[], help="other checkouts (stages, reads, rate)")
    a = p.parse_args()
    for tree in [ROOT, *a.against]:
        # every checkout's modules byte-compiled first, as an installed package's are (pip
        # compiles the peers' at install): a first batch measured in an environment with
        # PYTHONDONTWRITEBYTECODE=1 (this machine's) otherwise pays compiling the loader's
        # modules from source, ~20 ms, and the peers do not
        compileall.compile_dir(os.path.join(tree, "shardkit"), quiet=1)
    if set(a.probes) - {"llm", "transfer", "floor", "first"}:
        small, medium = make_data(a.work, "small"), make_data(a.work, "medium")
    print(f"load average before: {os.getloadavg()}")
    trees = [ROOT] + [os.path.abspath(t) for t in a.against]
    if "stages" in a.probes:
        runs = [(tree, ("stages", small)) for tree in trees]
        for tree, med in _interleaved(runs, a.runs):
            print(f"stages, small samples, us a sample, {tree}:", med)
    if "reads" in a.probes:
        _per_tree("reads", "us a sample", trees, (small, medium), a.runs)
    if "epochs" in a.probes:
        for name, m in (("small", small), ("medium", medium)):
            runs = [(ROOT, ("epochs", m, kept)) for kept in (True, False)]
            for (_, (_, _, kept)), (_, med) in zip(runs, _interleaved(runs, a.runs), strict=True):
                print(f"epochs, {name}, {'kept' if kept else 'fresh'} workers:", med)
    if "rate" in a.probes:
        _per_tree("rate", "2 fresh workers", trees, (small, medium), a.runs)
    if "transfer" in a.probes:
        specs = [(tree, ("transfer", make_llm(a.work))) for tree in trees]
        for tree, med in _interleaved(specs, a.runs):
            print(f"transfer, LLM documents, CPU us a batch of 32, {tree}:", med)
    if "first" in a.probes:
        specs = [(tree, ("first", make_llm(a.work))) for tree in trees]
        if os.path.exists(PEER_PYTHON):  # litdata's 2 kept workers, numpy batches
            specs.append((ROOT, ("llm_litdata", a.work, False, True)))
        for (tree, (kind, *_)), (_, med) in zip(specs, _interleaved(specs, a.runs), strict=True):
            who = "litdata" if kind == "llm_litdata" else tree
            print(f"first, LLM documents, 2 kept workers, s, {who}:", med)
    if "floor" in a.probes:
        for _, med in _interleaved([(ROOT, ("floor",))], a.runs):
            print("floor, torch DataLoader, 2 kept workers, CPU us an item:", med)
    if "llm" in a.probes:
        llm = make_llm(a.work)
        modes = ("0", "process", "thread")
        specs = [(tree, ("llm", llm, mode)) for tree in trees for mode in modes]
        peer = os.path.exists(PEER_PYTHON)
        if peer:  # litdata interleaved with the others
            specs += [(ROOT, ("llm_litdata", a.work, tensors)) for tensors in (False, True)]
        got = dict(zip(specs, _interleaved(specs, a.runs), strict=True))
        for (tree, (kind, *rest)), (_, med) in got.items():
            if kind == "llm":
                print(f"llm, {rest[-1]} workers, {tree}:", med)
            else:
                print(f"llm, litdata 2 workers, {'tensors' if rest[-1] else 'numpy'}:", med)
        if not peer:
            print(f"llm: no {PEER_PYTHON} (scripts/bench/setup.sh): litdata not measured")
        for tree in trees:
            zero, proc = got[(tree, ("llm", llm, "0"))][1], got[(tree, ("llm", llm, "process"))][1]
            cpu = proc["cpu_us_main"] + proc["cpu_us_workers"]
            ratio = proc["samples_per_s"] / zero["samples_per_s"]
            print(
                f"llm, {tree}: 2 processes / 0 workers {ratio:.2f}x"
                f" measured; at most {2 * zero['cpu_us_main'] / cpu:.2f}x on 2 idle cores (CPU us a"
                f" sample: 0 workers {zero['cpu_us_main']:.1f}, processes {cpu:.1f} in all)"
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
