"""The loader stats schema: one fixed set of keys, cold or warm, local or remote.

A *window* (the latest iteration, normally one epoch, or every iteration so far) is a flat
dict with these keys, always all of them; counts are ``int``, rates and times ``float``:

========================  =========================================================
``batches``               batches the training loop received
``samples``, ``bytes``    samples that reached the training loop (after ``select``
                          and skips), bytes read from the shards
``filtered_samples``      samples a ``select`` refused
``dropped_samples``       samples of this rank's share of the epoch never delivered
                          because the epoch ended for every rank at once (another
                          rank's data ended first): read ahead or never read; on
                          rank 0 also those an elastic resume's re-plan left out
                          (what was left did not divide by the new world size)
``seconds``               wall time from ``iter()`` to the last batch (summed)
``first_batch_s``         time from ``iter()`` to the first batch (for the total:
                          the first iteration's, the cold start)
``samples_per_s``         ``samples / seconds``; ``batches_per_s``, ``mb_per_s`` alike
``wait_mean_s``           how long the loop waited for a batch: mean, ``wait_p50_s``,
                          ``wait_p99_s``, ``wait_max_s``, ``wait_total_s``
``wait_fraction``         ``wait_total_s / seconds``: the training loop's idle share
``cache_hits``            opens served by shards already in the node cache
``cache_misses``          opens that had to download (this loader's downloads)
``cache_hit_ratio``       ``hits / (hits + misses)``, 0.0 when nothing was cached
``bytes_fetched``         bytes downloaded from the origin (http, s3)
``requests``              requests sent to the origin
``retries``               failed attempts retried: ``retries_throttled`` (429),
                          ``retries_server`` (5xx), ``retries_connection`` (no answer,
                          broken body), ``retries_checksum`` (a download that did not
                          match the manifest, fetched again)
``errors``                data errors handled by the ``handler`` policy:
                          ``errors_fetch``, ``errors_format``, ``errors_checksum``,
                          ``errors_decode``, ``errors_other``
``skipped_shards``        shards (or the rest of one) dropped; ``skipped_samples``
``skipped_members``       tar members a lenient tar policy passed over (links,
                          devices, FIFOs, unknown types; ``ReaderLimits(tar_policy=...)``)
``per_worker``            per DataLoader worker: ``worker``, ``batches``, ``samples``,
                          ``bytes``, ``samples_per_s``, ``mb_per_s``
``io``                    the raw io counters (:data:`IO_KEYS`, ints), summed
``time_worker_s``         where the time goes (:data:`TIME_KEYS`, seconds summed over
                          workers): making items in the workers; of it ``time_read_s``
                          (reading shard bytes, and verifying them where the read
                          does), ``time_decode_s`` (decoders), ``time_collate_s``
                          (batching) and ``time_other_s`` (the rest: tar parsing,
                          shuffling, maps). ``time_verify_s``: hashing what was read,
                          in any thread (inside ``time_read_s`` for a local read, in
                          the cache's fill threads for a download); ``time_transfer_s``:
                          handing batches from worker processes to the training
                          process (packing them in the worker and taking them over;
                          0 with thread workers); ``time_wait_s`` is the training
                          loop's wait for its next batch
========================  =========================================================

Cache hits and misses are counted per open of a cached object (a shard or its sample
index), as a CDN counts requests: every download this loader made is one miss (a shard
fetched ahead by its prefetch and then opened included: it was not in the cache when
the run began), every other open is a hit. A shard two workers share is downloaded once:
one miss and one hit. A warm run has no misses and fetches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "COUNT_KEYS",
    "ERROR_KINDS",
    "IO_KEYS",
    "RATE_KEYS",
    "RETRY_KINDS",
    "SCHEMA_VERSION",
    "TIME_KEYS",
    "WINDOW_KEYS",
    "window",
]

SCHEMA_VERSION = 1
RETRY_KINDS = ("throttled", "server", "connection", "checksum")
ERROR_KINDS = ("fetch", "format", "checksum", "decode", "other")
IO_KEYS = (
    "requests",
    "bytes_fetched",
    "retries",
    *(f"retries_{k}" for k in RETRY_KINDS[:3]),
    "cache_hits",
    "cache_misses",
    "cache_fills",
    "read_along",
    "prefetches",
    "takeovers",
    "uncached_reads",
    "cache_errors",
    "cache_no_room",
    "checksum_failures",
    "manifest_cache_hits",
)
COUNT_KEYS = (
    "batches",
    "samples",
    "bytes",
    "cache_hits",
    "cache_misses",
    "bytes_fetched",
    "requests",
    "retries",
    *(f"retries_{k}" for k in RETRY_KINDS),
    "errors",
    *(f"errors_{k}" for k in ERROR_KINDS),
    "skipped_shards",
    "skipped_samples",
    "skipped_members",
    "filtered_samples",
    "dropped_samples",
)
RATE_KEYS = (
    "seconds",
    "first_batch_s",
    "samples_per_s",
    "batches_per_s",
    "mb_per_s",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p99_s",
    "wait_max_s",
    "wait_total_s",
    "wait_fraction",
    "cache_hit_ratio",
)
TIME_KEYS = (
    "time_worker_s",
    "time_read_s",
    "time_verify_s",
    "time_decode_s",
    "time_collate_s",
    "time_other_s",
    "time_transfer_s",
    "time_wait_s",
)
WINDOW_KEYS = (*COUNT_KEYS, *RATE_KEYS, *TIME_KEYS, "per_worker", "io")


def _int(counts: Mapping[str, float], key: str) -> int:
    return round(float(counts.get(key, 0.0)))


def _times(
    counts: Mapping[str, float], io: Mapping[str, float], wait_total: float
) -> dict[str, float]:
    got = {k: float(counts.get(k, 0.0)) for k in ("worker_s", "read_s", "decode_s", "collate_s")}
    busy, read, decode, collate = got.values()
    return {
        "time_worker_s": busy,
        "time_read_s": read,
        "time_verify_s": float(io.get("verify_s", 0.0)),
        "time_decode_s": decode,
        "time_collate_s": collate,
        "time_other_s": max(busy - read - decode - collate, 0.0),
        "time_transfer_s": float(counts.get("transfer_s", 0.0)),
        "time_wait_s": float(wait_total),
    }


def window(
    *,
    batches: int,
    seconds: float,
    first_batch_s: float,
    waits: Iterable[float],
    wait_total: float,
    counts: Mapping[str, float],
    io: Mapping[str, float],
    workers: Mapping[int, tuple[int, Mapping[str, float]]],
) -> dict[str, Any]:
    """One window of the schema from raw sums: ``counts`` (samples, bytes, skips,
    ``errors_*``), ``io`` (the openers' counters) and per worker ``(batches, counts)``."""
    w = np.fromiter(waits, dtype=np.float64)
    per_s = 1.0 / seconds if seconds > 0 else 0.0
    raw_io = {k: _int(io, k) for k in IO_KEYS}
    opens = raw_io["cache_hits"] + raw_io["cache_misses"]
    # every download this loader made (its own reads' and its prefetches') was a miss
    misses = min(opens, raw_io["cache_fills"] + raw_io["cache_no_room"])
    misses = max(misses, raw_io["cache_misses"] - raw_io["read_along"])
    hits = opens - misses
    retries = {f"retries_{k}": raw_io.get(f"retries_{k}", 0) for k in RETRY_KINDS[:3]}
    retries["retries_checksum"] = raw_io["checksum_failures"]
    errors = {f"errors_{k}": _int(counts, f"errors_{k}") for k in ERROR_KINDS}
    out: dict[str, Any] = {
        "batches": int(batches),
        "samples": _int(counts, "samples"),
        "bytes": _int(counts, "bytes"),
        "cache_hits": hits,
        "cache_misses": misses,
        "bytes_fetched": raw_io["bytes_fetched"],
        "requests": raw_io["requests"],
        "retries": raw_io["retries"] + raw_io["checksum_failures"],
        **retries,
        "errors": sum(errors.values()),
        **errors,
        "skipped_shards": _int(counts, "skipped_shards"),
        "skipped_samples": _int(counts, "skipped_samples"),
        "skipped_members": _int(counts, "skipped_members"),
        "filtered_samples": _int(counts, "filtered_samples"),
        "dropped_samples": _int(counts, "dropped_samples"),
        "seconds": float(seconds),
        "first_batch_s": float(first_batch_s),
        "samples_per_s": float(counts.get("samples", 0.0)) * per_s,
        "batches_per_s": batches * per_s,
        "mb_per_s": float(counts.get("bytes", 0.0)) * per_s / 1e6,
        "wait_mean_s": float(w.mean()) if len(w) else 0.0,
        "wait_p50_s": float(np.percentile(w, 50)) if len(w) else 0.0,
        "wait_p99_s": float(np.percentile(w, 99)) if len(w) else 0.0,
        "wait_max_s": float(w.max()) if len(w) else 0.0,
        "wait_total_s": float(wait_total),
        "wait_fraction": min(1.0, wait_total * per_s),
        "cache_hit_ratio": hits / opens if opens else 0.0,
        **_times(counts, io, wait_total),
        "per_worker": [
            {
                "worker": i,
                "batches": int(nb),
                "samples": _int(c, "samples"),
                "bytes": _int(c, "bytes"),
                "samples_per_s": float(c.get("samples", 0.0)) * per_s,
                "mb_per_s": float(c.get("bytes", 0.0)) * per_s / 1e6,
            }
            for i, (nb, c) in sorted(workers.items())
        ],
        "io": raw_io,
    }
    return out
