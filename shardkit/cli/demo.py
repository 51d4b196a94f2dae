"""``shardkit demo``: generate a small LLM-style data set, build it, verify it, say how it went."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import click
import numpy as np

from shardkit.cache import make_opener
from shardkit.check.verify import verify
from shardkit.units import format_bytes, plural
from shardkit.write.build import build
from shardkit.write.inputs.sources import FieldMap, parse_field_spec

__all__ = ["command", "generate"]

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "dr", "on", "el")


def _vocabulary(rng: np.random.Generator) -> list[str]:
    """Every word of one to three syllables (2,954 words), in a seeded order."""
    s = _SYLLABLES
    words = [*s, *(a + b for a in s for b in s), *(a + b + c for a in s for b in s for c in s)]
    return [words[int(i)] for i in rng.permutation(len(words))]


def _documents(n: int, seed: int) -> Iterator[dict[str, Any]]:
    """``n`` documents: text of random words, tokens = the words' ids (int32)."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    lengths = rng.integers(128, 1024, size=n)
    for i in range(n):
        ids = rng.zipf(1.3, size=int(lengths[i])) % len(vocab)
        text = " ".join(map(vocab.__getitem__, ids.tolist()))
        yield {"id": i, "lang": "demo", "text": text, "tokens": ids.astype(np.int32)}


def generate(raw_dir: str, samples: int, *, kind: str = "jsonl", seed: int = 0) -> int:
    """Write ``samples`` documents under ``raw_dir`` as JSONL files or a file tree; bytes."""
    os.makedirs(raw_dir, exist_ok=True)
    nfiles = 4
    files = []
    if kind == "jsonl":
        files = [open(os.path.join(raw_dir, f"part-{k:04d}.jsonl"), "w") for k in range(nfiles)]  # noqa: SIM115
    with contextlib.ExitStack() as stack:
        for f in files:
            stack.enter_context(f)
        for doc in _documents(samples, seed):
            i = doc["id"]
            if kind == "jsonl":
                line = {**doc, "tokens": doc["tokens"].tolist()}
                files[i * nfiles // samples].write(json.dumps(line) + "\n")
                continue
            stem = os.path.join(raw_dir, f"shard{i * nfiles // samples}", f"doc{i:08d}")
            os.makedirs(os.path.dirname(stem), exist_ok=True)
            with open(stem + ".txt", "w", encoding="utf-8") as t:
                t.write(doc["text"])
            np.save(stem + ".tokens.npy", doc["tokens"], allow_pickle=False)
            with open(stem + ".json", "w", encoding="utf-8") as j:
                json.dump({"id": i, "lang": doc["lang"]}, j)
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(raw_dir) for f in names
    )


def _steps(out: str, samples: int, kind: str, workers: int, maxsize: str) -> dict[str, Any]:
    raw = os.path.join(out, "raw")
    shards = os.path.join(out, "shards")
    t0 = time.perf_counter()
    raw_bytes = generate(raw, samples, kind=kind)
    gen_secs = time.perf_counter() - t0
    fields: tuple[FieldMap, ...] = ()
    if kind == "jsonl":
        fields = (parse_field_spec("text=txt"), parse_field_spec("tokens=npy:int32"))
    result = build([raw], shards, maxsize=maxsize, workers=workers, fields=fields)
    opener = make_opener()
    report = verify(
        result.manifest, level="deep", jobs=2, opener=opener, source=result.manifest_path
    )
    from shardkit.streaming.measure import measure  # imports torch: only when streaming

    stream = measure(result.manifest_path, workers=workers, seconds=60, max_epochs=1, decode=True)
    return {
        "dir": out,
        "generate": {"samples": samples, "kind": kind, "bytes": raw_bytes, "seconds": gen_secs},
        "build": result.to_dict(),
        "verify": report.to_dict(),
        "stream": stream,
    }


def _lines(d: dict[str, Any]) -> list[str]:
    g, b, v = d["generate"], d["build"], d["verify"]
    fmt = format_bytes
    status = "OK" if v["ok"] else f"{len(v['problems'])} PROBLEMS"
    return [
        f"generated {plural(g['samples'], 'document')} (text + int32 tokens) as {g['kind']}: "
        f"{fmt(g['bytes'])} in {g['seconds']:.2f} s",
        f"built {plural(b['shards'], 'shard')}, {fmt(b['bytes'])}, in {b['seconds']:.2f} s "
        f"with {plural(b['workers'], 'worker')}: {b['samples_per_s']:,.0f} samples/s, "
        f"{b['mb_per_s']:.1f} MB/s of input",
        f"verified {plural(v['shards'], 'shard')} "
        f"({v['level']}: size, checksum, sample count, index) "
        f"in {v['seconds']:.2f} s: {status}",
        f"streamed {plural(d['stream']['samples'], 'sample')} through WebLoader "
        f"({plural(d['stream']['workers'], 'worker')}, batches of 32, decoded): "
        f"{d['stream']['samples_per_s']:,.0f} samples/s, {d['stream']['mb_per_s']:.1f} MB/s",
    ]


@click.command("demo")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Keep the data set here (default: a temporary directory, removed after).",
)
@click.option("--samples", type=click.IntRange(min=1), default=5_000, show_default=True)
@click.option(
    "--format",
    "kind",
    type=click.Choice(["jsonl", "files"]),
    default="jsonl",
    show_default=True,
    help="Generate JSONL files or a tree of .txt/.npy/.json files.",
)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--maxsize", default="4MB", show_default=True, help="Shard size (small for a demo).")
@click.option("--json", "as_json", is_flag=True, help="Print what happened as JSON.")
def command(out: str | None, samples: int, kind: str, workers: int, maxsize: str,
            as_json: bool) -> None:  # fmt: skip
    """Generate a synthetic text+tokens data set, build shards, verify them."""
    if out is not None and os.path.exists(out) and os.listdir(out):
        raise click.UsageError(f"{out} is not empty; give a new directory")
    tmp = None if out is not None else tempfile.mkdtemp(prefix="shardkit-demo-")
    where = out or tmp
    assert where is not None
    try:
        d = _steps(where, samples, kind, workers, maxsize)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if as_json:
        click.echo(json.dumps(d, indent=1))
        return
    click.echo("\n".join(_lines(d)))
    click.echo(
        f"shards and manifest in {os.path.join(where, 'shards')}"
        if out
        else "(the data set was in a temporary directory; pass --out DIR to keep it)"
    )
    if not d["verify"]["ok"]:
        click.get_current_context().exit(1)
