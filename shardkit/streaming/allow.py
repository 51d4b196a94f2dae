"""What a loaded state may differ in from the pipeline that loads it, and how it is fitted.

A state fits the pipeline whose fingerprint it carries. Some changes of a run are common
and have one meaning, so :meth:`~shardkit.WebLoader.load_state_dict` accepts them when
asked by name (``allow=``), and refuses them otherwise naming the change and the value:

- ``"batch_size"``: another ``batched(n)`` or ``batched(budget=...)``: the stream goes on
  at the first sample not yet given (the group a budget batching held is replayed: its
  items not yet given, in stream order; see :mod:`shardkit.stages.regroup`).
- ``"sources"``: a mixture gains, loses or renames sources (by name; a rename by a mapping,
  ``allow={"sources": {"old": "new"}}``): the kept ones go on from their cursors and
  epochs, a new one starts at its first epoch, a removed one's exposure is kept in the job
  state (``retired``) and in ``stats()["sources"]``, and its cursor in ``retired`` too: a
  later load that adds a source of that name back goes on from it (its workers' cursors
  merged as an elastic resume merges them), in its epoch, unless its data or pipeline
  changed (its fingerprint part differs: afresh, logged) or that epoch ended (see
  :mod:`shardkit.streaming.retired`). A group a budget batching holds goes on after its
  end (its samples were drawn from the old sources): its samples not given are left out,
  counted in ``stats()["dropped_samples"]``.
- ``"seq_len"``: another ``pack_tokens`` length: the token stream goes on at the first
  token not yet given (greedy); best-fit packing goes on at the next group.
- ``"weights"``: other mixture weights, schedule or source order (``reweight=True``, kept
  as an alias).

World size and worker count never need one (a state is re-planned for them).
:func:`diff_fingerprints` lists the changes, also those no value accepts; the CLI's
``shardkit state diff`` prints them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ConfigError, StateDictError
from shardkit.stages import Stage
from shardkit.stages.mixture import Mix, mix_state
from shardkit.stages.regroup import REGROUP, held_rest
from shardkit.stages.tokens import PackTokens
from shardkit.streaming.resume import check_fingerprint
from shardkit.streaming.retired import added_back, fit_mix, saved_spec

__all__ = [
    "ALLOW",
    "Allowed",
    "Change",
    "adapt_state",
    "adapt_states",
    "diff_fingerprints",
    "replaying",
]

log = logging.getLogger(__name__)
ALLOW = ("batch_size", "sources", "seq_len", "weights")
_BATCHINGS = ("batched", "budget_batched")
_GROUPS = ("budget_batched", "regroup", "held")  # batching states that may hold a group


@dataclass(frozen=True)
class Change:
    """One difference of a saved fingerprint from this pipeline's: ``kind`` the ``allow``
    value that accepts it (None: none does), ``what`` it is, in words."""

    kind: str | None
    what: str


@dataclass(frozen=True)
class Allowed:
    """The ``allow=`` of a load: the kinds of change accepted, and the sources renamed."""

    kinds: frozenset[str]
    rename: Mapping[str, str]

    @staticmethod
    def parse(allow: Collection[str] | Mapping[str, Any] | None, reweight: bool) -> Allowed:
        """``allow`` (names, or a mapping name -> True or, for ``"sources"``, renames)."""
        kinds: set[str] = {"weights"} if reweight else set()
        rename: dict[str, str] = {}
        if isinstance(allow, str | bytes):
            raise ConfigError(f"allow must be a set of names, not the string {allow!r}")
        if allow is not None and not isinstance(allow, Collection):
            raise ConfigError(f"allow must be a set of names, not {type(allow).__name__}")
        items = allow.items() if isinstance(allow, Mapping) else ((k, True) for k in allow or ())
        for kind, value in items:
            if kind not in ALLOW:
                raise ConfigError(f"allow: {kind!r} is not one of {ALLOW}")
            if isinstance(value, Mapping):
                if kind != "sources":
                    raise ConfigError(
                        f"allow: only 'sources' takes a mapping (renames), not {kind!r}"
                    )
                if not all(isinstance(x, str) for pair in value.items() for x in pair):
                    raise ConfigError(
                        f"allow: 'sources' renames names to names (strings), got {dict(value)!r}"
                    )
                rename.update(value)
            elif value is not True:
                raise ConfigError(f"allow: {kind!r} takes True or (sources) a mapping")
            kinds.add(kind)
        return Allowed(frozenset(kinds), rename)

    def check(self, changes: list[Change]) -> None:
        """Refuse the changes not accepted, naming each and the value that accepts it."""
        for c in changes:
            if c.kind is None:
                raise StateDictError(f"load_state_dict: {c.what}")
        refused = [c for c in changes if c.kind not in self.kinds]
        if refused:
            need = sorted({str(c.kind) for c in refused})
            whats = "; ".join(c.what for c in refused)
            raise StateDictError(
                f"load_state_dict: the state does not fit this pipeline: {whats}; to go on "
                f"from it load it with allow={set(need)!r}"
            )


def _name(entry: Any) -> Any:
    return entry.get("stage") if isinstance(entry, Mapping) else entry


def _strict(a: Any, b: Any, where: str) -> list[Change]:
    try:
        check_fingerprint([a], [b], where)
    except StateDictError as exc:
        return [Change(None, str(exc))]
    return []


def _batching(entry: Mapping[str, Any]) -> str:
    if entry.get("stage") == "batched":
        return f"batched({entry.get('n')})"
    return f"batched(budget={entry.get('budget')}, cost={entry.get('cost')})"


def diff_fingerprints(
    saved: Any, here: Any, rename: Mapping[str, str] | None = None, where: str = "pipeline"
) -> list[Change]:
    """Every difference of ``saved`` from ``here`` (pipeline fingerprints), each with the
    ``allow`` value that accepts it (None: none does)."""
    rename = rename or {}
    if not isinstance(saved, list) or not isinstance(here, list):
        return [Change(None, f"{where}: the state has no pipeline fingerprint")]
    if len(saved) != len(here):
        return [
            Change(
                None,
                f"{where}: the state was saved by stages {[_name(s) for s in saved]}, this is "
                f"{[_name(s) for s in here]}",
            )
        ]
    out: list[Change] = []
    if rename and where == "pipeline" and not any(_name(s) == Mix.name for s in here + saved):
        return [Change(None, f"allow renames sources {sorted(rename)}, but there is no mixture")]
    for a, b in zip(saved, here, strict=True):
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            out += _strict(a, b, where)
        elif a.get("stage") in _BATCHINGS and b.get("stage") in _BATCHINGS:
            if dict(a) != dict(b):
                out.append(Change("batch_size", f"{_batching(a)} -> {_batching(b)}"))
        elif a.get("stage") == b.get("stage") == PackTokens.name:
            if a.get("seq_len") != b.get("seq_len"):
                out.append(Change("seq_len", f"seq_len {a.get('seq_len')} -> {b.get('seq_len')}"))
            out += _strict({**a, "seq_len": 0}, {**b, "seq_len": 0}, where)
        elif a.get("stage") == b.get("stage") == Mix.name:
            out += _diff_mix(a, b, rename, where)
        else:
            out += _strict(a, b, where)
    return out


def _diff_mix(
    a: Mapping[str, Any], b: Mapping[str, Any], rename: Mapping[str, str], where: str
) -> list[Change]:
    out: list[Change] = []
    named = _check_renames(list(a.get("names", [])), list(b.get("names", [])), rename)
    if named:
        return [Change(None, f"{where}: {named}")]
    if a.get("schedule") != b.get("schedule"):
        out.append(Change("weights", "the mixture's weights or schedule"))
    old = [rename.get(n, n) for n in a.get("names", [])]
    new = list(b.get("names", []))
    renamed = {n: rename[n] for n in a.get("names", []) if n in rename}
    gone, came = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if gone or came or renamed:
        parts = [f"removed {gone}" if gone else "", f"added {came}" if came else ""]
        parts.append(f"renamed {renamed}" if renamed else "")
        out.append(Change("sources", "the mixture's sources: " + ", ".join(p for p in parts if p)))
    elif old != new:
        out.append(Change("weights", f"the mixture's source order {old} -> {new}"))
    subs_a = dict(zip(old, a.get("sources", []), strict=False))
    subs_b = dict(zip(new, b.get("sources", []), strict=False))
    for name in sorted(set(subs_a) & set(subs_b)):
        out += diff_fingerprints(subs_a[name], subs_b[name], {}, f"{where} mix source {name!r}")
    rest = ("names", "schedule", "sources")
    out += _strict(
        {k: v for k, v in a.items() if k not in rest},
        {k: v for k, v in b.items() if k not in rest},
        where,
    )
    return out


def _check_renames(saved: list[str], here: list[str], rename: Mapping[str, str]) -> str:
    """What is wrong with ``rename`` between a mixture's ``saved`` and ``here`` names ('' if
    nothing): each rename maps a source of the state to one of this pipeline, and no two
    sources go onto one name (a kept source started over, or two cursors folded)."""
    for old, new in rename.items():
        if old not in saved:
            return f"allow renames {old!r}, which is not a source of the state (its: {saved})"
        if new not in here:
            return (
                f"allow renames {old!r} to {new!r}, which is not a source of this pipeline "
                f"(its: {here})"
            )
    onto = [rename.get(n, n) for n in saved]
    twice = sorted({n for n in onto if onto.count(n) > 1})
    if twice:
        whose = {n: [m for m in saved if rename.get(m, m) == n] for n in twice}
        return f"allow renames two sources of the state onto one name: {whose}"
    return ""


def _walk(state: Any) -> Iterator[dict[str, Any]]:
    """Every stage state nested in ``state`` (it first), those past and before a held group
    too (``after``, an elastic merge's ``groups``)."""
    if isinstance(state, dict):
        yield state
        yield from _walk(state.get("source"))
        yield from _walk(state.get("after"))
        for sub in state.get("sources") or ():
            yield from _walk(sub)
        groups = state.get("groups") if state.get("stage") == "held" else None
        for group in groups if isinstance(groups, list) else ():
            if isinstance(group, dict):
                yield from _walk(group.get("source"))


def _stages(stage: Stage) -> Iterator[Stage]:
    yield stage
    for child in stage.children():
        yield from _stages(child)


def adapt_states(
    st: dict[str, Any], pipeline: Stage, changes: list[Change], allowed: Allowed
) -> dict[str, Any]:
    """The job state ``st`` fitted to ``pipeline`` for the accepted ``changes``: a
    best-fit packing's group left (seq_len), the mixture's sources renamed, added and
    removed (their exposure summed into ``retired``)."""
    kinds = {c.kind for c in changes}
    retired: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (st.get("retired") or {}).items()}
    mix = next((s for s in _stages(pipeline) if isinstance(s, Mix)), None)
    back: dict[str, dict[str, Any]] = {}
    if "sources" in kinds and mix is not None:
        back = added_back(mix, retired, st, allowed.rename)
    kept: dict[str, list[list[Any]]] = {}  # a removed source's cursor, by rank and worker
    world, workers = int(st["world"]), int(st["num_workers"])
    for r, entry in enumerate(st["ranks"]):
        rank = int(entry.get("rank", r))
        for w, ws in enumerate(entry["workers"]):
            cursors: dict[str, dict[str, Any]] = {}
            adapt_state(
                ws,
                pipeline,
                changes,
                allowed,
                retired,
                first=(rank, w) == (0, 0),
                back=back,
                cursors=cursors,
            )
            for name, cur in cursors.items():
                grid = kept.setdefault(name, [[None] * workers for _ in range(world)])
                grid[rank][w] = cur
    for name, grid in kept.items():  # restored when a load adds the source back
        spec = saved_spec(st["pipeline"], name, allowed.rename)
        done = retired.setdefault(name, {"samples": 0, "tokens": 0, "epochs": 0})
        done.update(cursor=grid, fingerprint=spec)
    st.pop("retired", None)
    if retired:
        st["retired"] = retired
    if kinds & {"batch_size", "seq_len", "sources"}:
        st["regrouped"] = True
    return st


def adapt_state(
    ws: dict[str, Any] | None,
    pipeline: Stage,
    changes: list[Change],
    allowed: Allowed,
    retired: dict[str, dict[str, Any]],
    *,
    first: bool = True,
    back: Mapping[str, Mapping[str, Any]] | None = None,
    cursors: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One pipeline state (a worker's, or a data set's) fitted to ``pipeline`` for the
    accepted ``changes``, in place; the exposure of the sources removed is added to
    ``retired`` (a merge's totals, which every worker that gave nothing since holds, by
    the ``first`` worker, rank 0's worker 0, only) and their cursors to ``cursors``; a
    source added back starts from ``back``
    (:func:`~shardkit.streaming.retired.added_back`), not afresh."""
    kinds = {c.kind for c in changes}
    mix = next((s for s in _stages(pipeline) if isinstance(s, Mix)), None)
    best_fit = any(
        isinstance(s, PackTokens) and s.strategy == "best_fit" for s in _stages(pipeline)
    )
    # a held group read again under a new packing or new sources gives other items (twice,
    # or other than those saved): the batchings go on after their groups
    settle = "seq_len" in kinds or ("sources" in kinds and mix is not None)
    left_out = held_rest(ws, "load_state_dict") if settle and "sources" in kinds else 0
    for sub in _walk(ws):
        if settle and sub.get("stage") in _GROUPS:
            _settle(sub)
        if "seq_len" in kinds and best_fit and sub.get("stage") == PackTokens.name:
            sub.update(skip=0, source=sub.pop("after", sub["source"]))
        if "sources" in kinds and mix is not None and sub.get("stage") == Mix.name:
            counted = retired if first or not sub.get("shared") else {}
            fit_mix(sub, mix, allowed.rename, counted, back or {}, first)
            if cursors is not None and not cursors:  # the worker's (outermost) mixture's
                cursors.update(sub.pop("_removed", {}))
            sub.pop("_removed", None)
    if left_out and ws is not None:  # samples drawn from the old sources, never given
        log.warning("load_state_dict: a sources change leaves out %d held samples", left_out)
        # counted by whatever batching reads the state (another n or budget too)
        carried = dict(ws)
        ws.clear()
        ws.update(stage=REGROUP, version=1, size=0, done="", source=carried, dropped=left_out)


def _settle(sub: dict[str, Any]) -> None:
    """A batching's state (in place) after the group it holds, its rest left out, as
    best-fit packing goes on at its next group: after a seq_len change the group's items
    are sequences the new packer does not make (a replay of them gave tokens twice), after
    a sources change a replay would draw other samples (given twice)."""
    if sub.get("stage") == "held":  # an elastic merge's groups: the same
        source = sub.get("source")
        sub.clear()
        sub.update(source if isinstance(source, dict) else {})
        return
    held = sub.get("stage") == "regroup" or sub.get("held", False)
    if not held:
        return
    after = sub.get("after")
    if not isinstance(after, dict):
        raise StateDictError(
            f"load_state_dict: a {sub.get('stage')} state holds a group with no end "
            "('after'): it cannot go on after a seq_len or sources change; load it into the "
            "old pipeline until the group is given"
        )
    if sub.get("stage") == "regroup":
        sub.clear()
        sub.update(after)
        return
    _exposure_given(sub, after)
    sub.pop("after")
    sub.pop("given", None)
    sub.update(held=False, size=0, skip=0, done="", source=after)


def _exposure_given(sub: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """A mixture's exposure past a budget group left out (in ``after``, in place): what it
    was before the group plus what of the group was given (the rest was never given)."""
    before, end = mix_state(sub.get("source")), mix_state(after)
    if not isinstance(before, dict) or not isinstance(end, dict):
        return
    counts = [[int(x) for x in c] for c in before.get("counts", [])]
    if len(counts) != len(end.get("counts", [])):
        return
    for k, samples, tokens in sub.get("given") or ():
        if 0 <= k < len(counts):
            counts[k] = [counts[k][0] + int(samples), counts[k][1] + int(tokens)]
    end["counts"] = counts


def replaying(states: Any) -> bool:
    """Some worker state holds a group being replayed (after a batching change or an
    elastic resume)."""
    return any(sub.get("stage") in ("regroup", "held") for ws in states or () for sub in _walk(ws))
