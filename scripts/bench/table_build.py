"""Build benchmark from Parquet: shardkit build vs Ray Data's write_webdataset, same rows.

Hub-style rows (an Image struct ``{bytes, path}`` of ``--image-bytes`` random bytes, a
caption, a label) in one Parquet file with row groups of 1,000 rows. Contenders, interleaved,
medians:

- ``shardkit build FILE -o OUT`` with 1 and 2 workers (tar shards + sample indexes +
  sha256 manifest, each shard fsynced), in-process through plan_build / run_build;
- Ray Data ``read_parquet(FILE).map(row -> bytes fields).write_webdataset(OUT)`` on
  ``ray.init(num_cpus=2)`` (it takes only bytes/str values, so the Image struct is mapped
  by hand; tar files only: no manifest, no checksum, no index); ray starts once, first.

- a raw copy of the Parquet file's bytes (read, write, fsync): the floor for moving them.

Rows/s and bytes on disk for each; wall seconds (the builds use 1 or 2 processes), the load
average beside them.

    .venv/bin/python scripts/bench/table_build.py --rows 50000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from typing import Any

import numpy as np
from _common import dir_bytes, finish, fmt, fresh_dir, log, table


def make_parquet(path: str, rows: int, image_bytes: int) -> int:
    """Write the rows; return the payload bytes (image bytes + caption + label)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # every image its own random bytes, as on the Hub: a small pool of repeated ones would
    # be dictionary-encoded by Parquet into a file a fraction of the payload
    rng = np.random.default_rng(0)
    blob = rng.bytes(rows * image_bytes)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array(
        [
            {"bytes": blob[i * image_bytes : (i + 1) * image_bytes], "path": f"img_{i:08d}.jpg"}
            for i in range(rows)
        ],
        image,
    )
    captions = [f"caption of image {i}" for i in range(rows)]
    table_ = pa.table({"image": images, "caption": captions, "label": list(range(rows))})
    pq.write_table(table_, path, row_group_size=1000)
    return rows * image_bytes + sum(len(c) for c in captions) + 8 * rows


def run_shardkit(src: str, out: str, workers: int) -> None:
    from shardkit.write.build import BuildConfig, plan_build, run_build

    # the image cells are random bytes, not images: unchecked, as Ray's writer leaves them
    cfg = BuildConfig(workers=workers, maxsize="256MB", check_images="off")
    run_build(plan_build([src], fresh_dir(out), cfg))


def _as_sample(row: dict[str, Any]) -> dict[str, Any]:
    """What write_webdataset takes: bytes or str per field (the user maps the struct)."""
    return {
        "__key__": os.path.splitext(row["image"]["path"])[0],
        "jpg": row["image"]["bytes"],
        "txt": row["caption"],
        "cls": str(row["label"]),
    }


def _as_is(sample: dict[str, Any]) -> dict[str, Any]:
    """No encoding: the fields are bytes already (ray's default would want PIL images)."""
    return sample


def run_copy(src: str, out: str) -> None:
    """The Parquet bytes copied as they are, fsynced (shardkit fsyncs each shard)."""
    target = os.path.join(fresh_dir(out), "copy.parquet")
    with open(src, "rb") as f, open(target, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
        g.flush()
        os.fsync(g.fileno())


def run_ray(src: str, out: str) -> None:
    import ray.data

    fresh_dir(out)
    ray.data.read_parquet(src).map(_as_sample).write_webdataset(out, encoder=_as_is)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--image-bytes", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default="bench-out/data")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    root = fresh_dir(os.path.join(args.work, "table_build"))
    src = os.path.join(root, "train.parquet")
    payload = make_parquet(src, args.rows, args.image_bytes)
    log(f"table_build: {args.rows:,} rows, {payload / 1e6:.0f} MB payload")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    contenders: list[tuple[str, Any]] = [
        ("shardkit build, 1 worker", lambda o: run_shardkit(src, o, 1)),
        ("shardkit build, 2 workers", lambda o: run_shardkit(src, o, 2)),
        ("ray write_webdataset, 2 CPUs", lambda o: run_ray(src, o)),
        ("raw copy of the Parquet bytes", lambda o: run_copy(src, o)),
    ]
    seconds: dict[str, list[float]] = {name: [] for name, _ in contenders}
    disk: dict[str, int] = {}
    for rep in range(args.repeats):
        k = rep % len(contenders)
        for name, fn in contenders[k:] + contenders[:k]:
            out = os.path.join(root, "".join(c if c.isalnum() else "-" for c in name))
            os.sync()
            t0 = time.perf_counter()
            fn(out)
            seconds[name].append(time.perf_counter() - t0)
            disk[name] = dir_bytes(out)
            log(f"  rep {rep + 1}/{args.repeats} {name:<30} {seconds[name][-1]:8.2f} s")
    ray.shutdown()
    load = os.getloadavg()
    rows, records = [], []
    for name, secs in seconds.items():
        med = statistics.median(secs)
        rec = {"name": name, "seconds": secs, "rows_per_s": args.rows / med}
        rec |= {"bytes_on_disk": disk[name], "x_payload": disk[name] / payload}
        records.append(rec)
        cells = [fmt(med, ".2f"), fmt(args.rows / med), fmt(disk[name] / 1e6)]
        rows.append([name, *cells, fmt(disk[name] / payload, ".2f") + "x"])
    head = ["Parquet -> shards", "median s", "rows/s", "MB on disk", "disk / payload"]
    text = table(head, rows)
    results = {"rows": args.rows, "payload_bytes": payload, "contenders": records}
    results["parquet_bytes"] = os.path.getsize(src)
    note = f"medians of {args.repeats}; load average at the end " + "/".join(
        f"{x:.1f}" for x in load
    )
    finish(args.out, "table_build", results, [f"### build from Parquet\n\n{text}\n"], note)


if __name__ == "__main__":
    main()
