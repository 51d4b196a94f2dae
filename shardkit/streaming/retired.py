"""A mixture source a load removed (``allow={"sources"}``): its exposure and its cursor,
kept in the job state's ``retired``, and where a source of its name added back goes on.

``retired`` maps a removed source's name to its exposure (job totals: ``samples``,
``tokens``, ``epochs``, in ``stats()["sources"]``), its ``cursor`` (by rank and worker of
the run that removed it: ``{"epoch", "source"}``, the source pipeline's state) and its
``fingerprint`` (its part of the pipeline's). A load that adds a source of that name back
merges those cursors as an elastic resume merges a source's, and the source goes on in its
epoch: no document twice in an epoch. It starts afresh where its data or pipeline changed
(its fingerprint part differs: logged) or its epoch ended while it was out; a state saved
before cursors were kept loads as before (afresh).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from typing import Any

from shardkit.stages.mixture import Mix

__all__ = ["added_back", "exposure_of", "fit_mix", "retired_exposure", "saved_spec"]

log = logging.getLogger(__name__)


def fit_mix(
    sub: dict[str, Any],
    mix: Mix,
    rename: Mapping[str, str],
    retired: dict[str, dict[str, Any]],
    back: Mapping[str, Mapping[str, Any]],
    first: bool,
) -> None:
    """A mixture state fitted to ``mix``'s sources (in place); the cursors of the sources
    removed in ``sub["_removed"]``; a source added back from ``back`` (its exposure, the job
    totals, by the ``first`` worker)."""
    names = [rename.get(n, n) for n in sub["names"]]
    keyed = ("exhausted", "epochs", "counts", "sources")
    old = {n: {k: sub[k][i] for k in keyed} for i, n in enumerate(names)}
    removed = {}
    for name, was in old.items():
        if name not in mix.names:
            done = retired.setdefault(name, {"samples": 0, "tokens": 0, "epochs": 0})
            done["samples"] += int(was["counts"][0])
            done["tokens"] += int(was["counts"][1])
            done["epochs"] = max(done["epochs"], int(was["epochs"]))
            removed[name] = {"epoch": int(was["epochs"]), "source": was["sources"]}
    start = 0 if mix.stop == "never" else int(sub["epoch"])
    for name in mix.names:
        if name not in old:
            again = back.get(name, {})
            counts = again.get("counts", [0, 0]) if first else [0, 0]
            epoch = again.get("epoch", start)
            old[name] = {"exhausted": False, "epochs": epoch, "counts": list(counts)}
            old[name]["sources"] = copy.deepcopy(again.get("source"))
    for k in keyed:
        sub[k] = [old[n][k] for n in mix.names]
    sub["names"] = list(mix.names)
    sub["_removed"] = removed


def _saved_mix(pipeline: Any) -> Mapping[str, Any]:
    """The mixture's entry of a saved pipeline fingerprint ({} if none)."""
    for entry in pipeline if isinstance(pipeline, list) else ():
        if isinstance(entry, Mapping) and entry.get("stage") == Mix.name:
            return entry
    return {}


def _saved_names(pipeline: Any, rename: Mapping[str, str]) -> list[str]:
    """The mixture's source names of a saved pipeline fingerprint, renamed."""
    return [rename.get(n, n) for n in _saved_mix(pipeline).get("names") or ()]


def saved_spec(pipeline: Any, name: str, rename: Mapping[str, str]) -> Any:
    """The fingerprint part of the mixture source ``name`` (renamed) in a saved pipeline
    fingerprint (None: not found)."""
    names, specs = _saved_names(pipeline, rename), _saved_mix(pipeline).get("sources") or []
    return specs[names.index(name)] if name in names[: len(specs)] else None


def added_back(
    mix: Mix, retired: dict[str, dict[str, Any]], st: Mapping[str, Any], rename: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Where each source of ``mix`` that a load had removed (its cursor kept in
    ``retired``, taken out of it) and this one adds back goes on: ``{"epoch", "source",
    "counts"}``, its cursors merged as an elastic resume merges them. It starts afresh (its
    exposure kept) when its data or pipeline changed (logged), or its epoch has ended."""
    saved = _saved_names(st["pipeline"], rename)
    out: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(mix.names):
        if name not in retired or name in saved:  # kept (an old state's 'retired' too)
            continue
        done = retired.pop(name)
        counts = [int(done["samples"]), int(done["tokens"])]
        out[name] = {"counts": counts}
        grid = done.get("cursor")
        if not isinstance(grid, list):  # a state saved before cursors were kept
            continue
        here = json.loads(json.dumps(mix.stages[k].spec()))
        if done.get("fingerprint") != here:
            log.warning(
                "load_state_dict: mixture source %r is added back with other data or another "
                "pipeline than when it was removed: it starts afresh (the documents it gave "
                "before its removal may be given again)",
                name,
            )
            continue
        found = [c for row in grid for c in row if isinstance(c, Mapping)]
        epoch = max((int(c["epoch"]) for c in found), default=None)
        if epoch is None or (mix.stop != "never" and epoch != int(st["epoch"])):
            continue  # its epoch ended while it was out: the new one starts afresh
        subs = [
            [c["source"] if isinstance(c, Mapping) and c["epoch"] == epoch else None for c in row]
            for row in grid
        ]
        out[name].update(epoch=epoch, source=mix.stages[k].merge(subs))
    return out


def retired_exposure(st: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The sources a load removed, from a job state: each one's exposure (job totals:
    ``samples``, ``tokens``, ``epochs``) and, where kept, its ``cursor`` (by rank and
    worker) and ``fingerprint`` (:func:`exposure_of` takes the exposure alone)."""
    return {k: copy.deepcopy(dict(v)) for k, v in (st.get("retired") or {}).items()}


def exposure_of(done: Mapping[str, Any]) -> dict[str, int]:
    """A removed source's exposure: ``samples``, ``tokens`` and ``epochs``."""
    return {k: int(done[k]) for k in ("samples", "tokens", "epochs")}
