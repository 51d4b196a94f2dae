"""Loader stats where teams look: TensorBoard scalars and Prometheus metrics.

Each is one line in a training loop (``stats = loader.stats()``, or the job's view)::

    sk.export.tensorboard(writer, loader.stats(), step)          # a SummaryWriter
    sk.export.write_prometheus("/var/lib/node_exporter/shardkit.prom", loader.stats())
    sk.export.serve_prometheus(loader, port=9400)                # needs prometheus_client

TensorBoard tags are ``data/<key>`` for the whole run, ``data/epoch/<key>`` for the
latest epoch and ``data/worker<i>/<key>`` per worker. Prometheus names are
``shardkit_loader_<key>`` (counts of the whole run as counters, ``..._total``),
``shardkit_loader_epoch_<key>`` for the latest epoch, per-worker rates with a ``worker``
label, a mixture's exposure per source (``shardkit_loader_source_samples`` ...) with a
``source`` label (TensorBoard: ``data/source/<name>/<key>``), and every sample labelled
with ``rank`` when given. The text is the Prometheus
exposition format (version 0.0.4): a node exporter's textfile collector reads the file;
``serve_prometheus`` (``pip install 'shardkit[metrics]'``) serves it over HTTP.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from shardkit.errors import ConfigError
from shardkit.metrics.job import scalars
from shardkit.metrics.schema import COUNT_KEYS

__all__ = [
    "Metric",
    "metrics",
    "prometheus_text",
    "serve_prometheus",
    "tensorboard",
    "write_prometheus",
]

_WORKER_KEYS = ("batches", "samples", "bytes", "samples_per_s", "mb_per_s")
_SOURCE_KEYS = ("samples", "tokens", "epochs", "share", "weight")


def tensorboard(writer: Any, stats: Mapping[str, Any], step: int, *, prefix: str = "data") -> None:
    """Add every number of ``stats`` to ``writer`` (a ``SummaryWriter``) at ``step``."""
    for key, value in scalars(stats).items():
        writer.add_scalar(f"{prefix}/{key}", value, step)
    epoch = stats.get("this_epoch")
    if isinstance(epoch, Mapping):
        for key, value in scalars(epoch).items():
            writer.add_scalar(f"{prefix}/epoch/{key}", value, step)
    for w in stats.get("per_worker", ()):
        for key in _WORKER_KEYS:
            writer.add_scalar(f"{prefix}/worker{w['worker']}/{key}", float(w[key]), step)
    for name, row in (stats.get("sources") or {}).items():
        for key in _SOURCE_KEYS:
            writer.add_scalar(f"{prefix}/source/{name}/{key}", float(row[key]), step)


class Metric(NamedTuple):
    """One Prometheus metric family: name, type, help and its ``(labels, value)`` samples."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    samples: list[tuple[dict[str, str], float]]


def metrics(
    stats: Mapping[str, Any], *, prefix: str = "shardkit_loader", rank: int | None = None
) -> list[Metric]:
    """The metric families of ``stats`` (what :func:`prometheus_text` writes)."""
    base = {} if rank is None else {"rank": str(rank)}
    out: list[Metric] = []
    for key, value in scalars(stats).items():
        if key in COUNT_KEYS or key == "stalls":  # stalls: the loader's, not a window's
            out.append(Metric(f"{prefix}_{key}", "counter", f"{key} since start", [(base, value)]))
        else:
            out.append(Metric(f"{prefix}_{key}", "gauge", f"{key} since start", [(base, value)]))
    epoch = stats.get("this_epoch")
    if isinstance(epoch, Mapping):
        for key, value in scalars(epoch).items():
            out.append(
                Metric(f"{prefix}_epoch_{key}", "gauge", f"{key}, latest epoch", [(base, value)])
            )
    workers = list(stats.get("per_worker", ()))
    for key in _WORKER_KEYS if workers else ():
        samples = [({**base, "worker": str(w["worker"])}, float(w[key])) for w in workers]
        out.append(Metric(f"{prefix}_worker_{key}", "gauge", f"{key} per worker", samples))
    stalled = [r for r in stats.get("stall", ()) if r.get("worker") is not None or r.get("thread")]
    if stalled:  # the latest stall report: how long each worker has waited, and on what
        rows = [
            ({**base, "worker": str(r["worker"] if r["worker"] is not None else r["thread"]),
              "waits": str(r["waits"])}, float(r.get("for_s", 0.0)))
            for r in stalled
        ]  # fmt: skip
        out.append(Metric(f"{prefix}_stall_wait_s", "gauge", "latest stall: seconds waited", rows))
    sources = dict(stats.get("sources") or {})
    for key in _SOURCE_KEYS if sources else ():
        kind = "counter" if key in ("samples", "tokens") else "gauge"
        rows = [({**base, "source": str(n)}, float(r[key])) for n, r in sources.items()]
        out.append(Metric(f"{prefix}_source_{key}", kind, f"{key} per mixture source", rows))
    return out


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc, strict=True)) + "}"


def prometheus_text(
    stats: Mapping[str, Any], *, prefix: str = "shardkit_loader", rank: int | None = None
) -> str:
    """``stats`` in the Prometheus text exposition format."""
    lines: list[str] = []
    for m in metrics(stats, prefix=prefix, rank=rank):
        name = f"{m.name}_total" if m.kind == "counter" else m.name
        lines.append(f"# HELP {name} {m.help}")
        lines.append(f"# TYPE {name} {m.kind}")
        lines += [f"{name}{_labels(lb)} {_value(v)}" for lb, v in m.samples]
    return "\n".join(lines) + "\n"


def write_prometheus(
    path: str | os.PathLike[str],
    stats: Mapping[str, Any],
    *,
    prefix: str = "shardkit_loader",
    rank: int | None = None,
) -> None:
    """Write ``stats`` to ``path`` for a node exporter's textfile collector, atomically
    (a scrape never sees half a file)."""
    path = os.fspath(path)
    text = prometheus_text(stats, prefix=prefix, rank=rank)
    fd, tmp = tempfile.mkstemp(
        prefix=".shardkit-", suffix=".prom.tmp", dir=os.path.dirname(path) or "."
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # the exporter runs as another user
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def serve_prometheus(
    source: Any,
    port: int = 9400,
    *,
    addr: str = "127.0.0.1",
    prefix: str = "shardkit_loader",
    rank: int | None = None,
) -> Any:
    """Serve a loader's stats on ``http://addr:port/metrics`` from a daemon thread, read
    afresh at every scrape. ``source`` is a :class:`~shardkit.WebLoader` (or anything with
    ``stats()``) or a function returning stats. Needs ``prometheus_client``; returns its
    HTTP server (``.server_port`` is the port, useful with ``port=0``; ``.shutdown()``)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError as exc:
        raise ConfigError(
            "serve_prometheus needs prometheus_client: pip install 'shardkit[metrics]'"
        ) from exc
    get: Callable[[], Mapping[str, Any]] = source if callable(source) else source.stats

    class _Collector:
        def collect(self) -> Iterator[Any]:
            for m in metrics(get(), prefix=prefix, rank=rank):
                names = sorted({k for lb, _ in m.samples for k in lb})
                cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
                fam = cls(m.name, m.help, labels=names)
                for lb, v in m.samples:
                    fam.add_metric([lb[k] for k in names], v)
                yield fam

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
