"""``shardkit state show CKPT`` and ``shardkit state diff CKPT --pipeline FILE:FN``: a saved
loader state, read offline.

``CKPT`` is a JSON file or a torch checkpoint (read with ``weights_only=True``) holding a
:meth:`~shardkit.WebLoader.state_dict` anywhere inside (``--key data`` names where). ``show``
prints its epoch, world, workers, each source's progress and exposure and the pipeline's
fingerprint; ``diff`` builds the pipeline ``FN()`` of ``FILE`` (a WebLoader or a
ShardDataset) and says which ``allow=`` values a load of the state into it needs. Exit 1
when the state cannot be read, or a change no ``allow`` value accepts.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from shardkit.errors import ConfigError, ShardkitError, StateDictError, redact
from shardkit.stages.mixture import given_in, mix_state
from shardkit.streaming.allow import diff_fingerprints
from shardkit.streaming.resume import STAGE, check_job_state
from shardkit.streaming.retired import exposure_of

__all__ = ["command"]


def find_state(obj: Any, key: str | None) -> dict[str, Any]:
    """The loader state in a loaded checkpoint: under the dotted ``key``, or the first one
    found."""
    if key:
        for part in key.split("."):
            if not isinstance(obj, Mapping) or part not in obj:
                raise StateDictError(f"the checkpoint has no key {key!r} (at {part!r})")
            obj = obj[part]
    found = next(_states(obj), None)
    if found is None:
        raise StateDictError(
            "the checkpoint holds no WebLoader state (a dict with stage 'webloader')"
        )
    return check_job_state(found)


def _states(obj: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(obj, Mapping):
        if obj.get("stage") == STAGE:
            yield obj
            return
        for value in obj.values():
            yield from _states(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _states(value)


def _numpy_globals() -> list[Any]:
    """What a checkpoint's numpy arrays and scalars (a numpy RNG state beside the loader's,
    as trainers save it) unpickle with: numbers only, no code (an object array's items
    still need globals of their own, which ``weights_only`` refuses)."""
    import numpy as np

    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1.x
        multiarray = importlib.import_module("numpy.core.multiarray")

    kinds = "?bhilqBHILQefdgFDGSU"  # bool, ints, floats, complex, bytes, str
    dtypes = {type(np.dtype(k)) for k in kinds}
    return [np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar, *dtypes]


def load_checkpoint(path: str, key: str | None) -> dict[str, Any]:
    """The checked loader state of the checkpoint file ``path``."""
    p = Path(path)
    if p.suffix == ".json":
        try:
            obj = json.loads(p.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise StateDictError(f"{path}: not valid JSON: {exc}") from None
    else:
        import torch

        try:
            allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
            with allow(_numpy_globals()) if allow else contextlib.nullcontext():
                obj = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds for a file it cannot read
            # not torch's text: it advises weights_only=False (arbitrary code execution)
            raise StateDictError(
                f"{path}: not a torch checkpoint that loads with weights_only=True "
                f"({type(exc).__name__}); a JSON state file must end in .json"
            ) from exc
    return find_state(obj, key)


def _walk(state: Any, name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(source name, stage state) for every stage state nested in ``state``."""
    if not isinstance(state, Mapping):
        return
    yield name, state
    yield from _walk(state.get("source"), name)
    if state.get("stage") == "mix":
        for sub_name, sub in zip(state.get("names", []), state.get("sources", []), strict=False):
            yield from _walk(sub, str(sub_name))


def _tally(ws: Any, first: bool, entry: Callable[[str], dict[str, Any]]) -> None:
    """Add one worker's state ``ws`` to the per-source ``entry``: the shards' progress, and
    a mixture's exposure as the loader's stats count it (:meth:`Mix.exposure`: a merge's
    totals once, at rank 0 worker 0 (``first``); what a batching held back and gave)."""
    top = mix_state(ws)
    for name, sub in _walk(ws, "shards"):
        if sub.get("stage") == "shards":
            e = entry(name)
            e["read"] += int(sub.get("position", 0))
            e["samples_total"] = sub.get("nsamples")
            e["epoch"] = sub.get("epoch", e["epoch"])
        elif sub.get("stage") == "mix":
            names = list(sub.get("names", []))
            counts = [[int(x) for x in c] for c in sub["counts"]]
            if sub is top:
                if sub.get("shared") and not first:
                    counts = [[0, 0] for _ in names]
                given = given_in(ws, len(names))
                counts = [[c[0] + g[0], c[1] + g[1]] for c, g in zip(counts, given, strict=True)]
            for k, n in enumerate(names):
                e = entry(str(n))
                e["samples"] = e.get("samples", 0) + counts[k][0]
                e["tokens"] = e.get("tokens", 0) + counts[k][1]


def summary(st: Mapping[str, Any]) -> dict[str, Any]:
    """What a job state holds, as JSON-safe facts: per source its progress, and under a
    mixture its exposure (``samples``, ``tokens``; a pipeline without one keeps none)."""
    sources: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return sources.setdefault(name, {"read": 0, "samples_total": None, "epoch": st["epoch"]})

    for rank in st["ranks"]:
        for w, ws in enumerate(rank["workers"]):
            try:
                _tally(ws, (int(rank["rank"]), w) == (0, 0), entry)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
                raise StateDictError(
                    f"webloader: rank {rank['rank']} worker {w}: a stage state is not one a "
                    f"loader saves ({type(exc).__name__}: {exc}): the state was edited or "
                    "damaged"
                ) from None
    for name, done in (st.get("retired") or {}).items():
        sources[name] = {**entry(name), **exposure_of(done), "removed": True}
    return {
        "epoch": st["epoch"],
        "complete": st["complete"],
        "world": st["world"],
        "workers": st["num_workers"],
        "batches": {int(r["rank"]): int(r["batches"]) for r in st["ranks"]},
        "sources": sources,
        "pipeline": st["pipeline"],
    }


def _params(entry: Any) -> str:
    if not isinstance(entry, Mapping):
        return json.dumps(entry)
    parts = [f"{k}={json.dumps(v)}" for k, v in entry.items() if k not in ("stage", "sources")]
    return f"{entry.get('stage')}  " + " ".join(parts)


def _show_lines(path: str, d: Mapping[str, Any]) -> list[str]:
    done = "ended" if d["complete"] else "in progress"
    lines = [
        f"state {path}",
        f"  epoch {d['epoch']} ({done}), {d['world']} ranks x {d['workers']} workers",
        f"  batches given per rank: {d['batches']}",
        "  sources:",
    ]
    for name, s in d["sources"].items():
        total = s.get("samples_total")
        read = f"read {s['read']:,} of {total:,} samples" if total else f"read {s['read']:,}"
        gone = " (removed)" if s.get("removed") else ""
        line = f"    {name}{gone}: epoch {s['epoch']}, {read}"
        if "samples" in s:  # a mixture's source: what it gave
            line += f"; exposure {s['samples']:,} samples, {s['tokens']:,} tokens"
        lines.append(line)
    lines.append("  pipeline:")
    for entry in d["pipeline"]:
        lines.append(f"    {_params(entry)}")
        if isinstance(entry, Mapping) and entry.get("stage") == "mix":
            for name, sub in zip(entry.get("names", []), entry.get("sources", []), strict=False):
                lines.append(f"      source {name}:")
                lines += [f"        {_params(e)}" for e in sub]
    return lines


def load_pipeline(spec: str) -> Any:
    """``FILE.py:FN`` called: a WebLoader or a ShardDataset."""
    file, sep, fn = spec.rpartition(":")
    if not sep or not file or not fn:
        raise click.BadParameter(f"{spec!r}: give FILE.py:FUNCTION", param_hint="--pipeline")
    if not Path(file).is_file():
        raise click.BadParameter(f"{file}: no such file", param_hint="--pipeline")
    loaded = importlib.util.spec_from_file_location("_shardkit_pipeline", file)
    if loaded is None or loaded.loader is None:
        raise click.BadParameter(f"{file}: not a Python file", param_hint="--pipeline")
    module = importlib.util.module_from_spec(loaded)
    sys.modules["_shardkit_pipeline"] = module  # pickled user code can be found again
    try:
        loaded.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error, named as theirs
        raise ConfigError(f"--pipeline {spec}: {file} raised {type(exc).__name__}: {exc}") from exc
    make = getattr(module, fn, None)
    if make is None:
        raise click.BadParameter(f"{file} has no {fn!r}", param_hint="--pipeline")
    try:
        made = make()
    except Exception as exc:
        raise ConfigError(f"--pipeline {spec}: {fn}() raised {type(exc).__name__}: {exc}") from exc
    dataset = getattr(made, "dataset", made)
    if not callable(getattr(dataset, "fingerprint", None)):
        raise ConfigError(
            f"--pipeline {spec}: {fn}() gave {type(made).__name__}, not a WebLoader or a "
            "ShardDataset"
        )
    return dataset


def _echo(text: str) -> None:
    """Printed with every credential a (hand-made) state may hold in a url redacted."""
    click.echo(redact(text))


def _failed(exc: ShardkitError, as_json: bool) -> None:
    """A state or pipeline that cannot be read: exit 1, as one JSON object with --json."""
    if not as_json:
        raise exc
    _echo(json.dumps({"error": str(exc)}, indent=2))
    click.get_current_context().exit(1)


@click.group("state")
def command() -> None:
    """Read a saved loader state (a checkpoint's WebLoader.state_dict()) offline."""


ckpt_argument = click.argument("ckpt", type=click.Path(exists=True, dir_okay=False))
key_option = click.option("--key", default=None, help="Where the state is (dotted, e.g. data).")


@command.command("show")
@ckpt_argument
@key_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(ckpt: str, key: str | None, as_json: bool) -> None:
    """Epoch, world, workers, per-source progress and exposure, the pipeline's fingerprint."""
    try:
        d = summary(load_checkpoint(ckpt, key))
    except ShardkitError as exc:
        _failed(exc, as_json)
        return
    if as_json:
        _echo(json.dumps(d, indent=2))
        return
    _echo("\n".join(_show_lines(ckpt, d)))


@command.command("diff")
@ckpt_argument
@key_option
@click.option("--pipeline", "spec", required=True, help="FILE.py:FUNCTION making the loader.")
@click.option("--rename", multiple=True, help="A mixture source renamed: OLD=NEW (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def diff(ckpt: str, key: str | None, spec: str, rename: tuple[str, ...], as_json: bool) -> None:
    """Which allow= values loading CKPT into the pipeline FILE.py:FUNCTION makes needs."""
    renames = dict(r.split("=", 1) for r in rename if "=" in r)
    if len(renames) != len(rename):
        raise click.BadParameter("give renames as OLD=NEW", param_hint="--rename")
    try:
        st = load_checkpoint(ckpt, key)
        fingerprint = load_pipeline(spec).fingerprint()
    except ShardkitError as exc:
        _failed(exc, as_json)
        return
    changes = diff_fingerprints(st["pipeline"], fingerprint, renames)
    need = sorted({c.kind for c in changes if c.kind is not None})
    refused = [c.what for c in changes if c.kind is None]
    out = {
        "allow": need,
        "rename": renames,
        "changes": [{"allow": c.kind, "what": c.what} for c in changes],
        "refused": refused,
        "world": st["world"],
        "workers": st["num_workers"],
    }
    if as_json:
        _echo(json.dumps(out, indent=2))
    else:
        for c in changes:
            _echo(f"{c.kind or 'refused'}: {c.what}")
        if refused:
            _echo("the state cannot be loaded into this pipeline")
        elif need:
            arg: Any = set(need)
            if renames:
                arg = {k: renames if k == "sources" else True for k in need}
            _echo(f"load with allow={arg!r}")
        else:
            _echo("loads as it is (world size and worker count are re-planned)")
    if refused:
        click.get_current_context().exit(1)
