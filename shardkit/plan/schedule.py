"""Mixture weights over the job's progress: pure maths, no I/O.

A :class:`Schedule` is a list of points ``(at, weights)``: ``at`` is the job's progress (the
samples, or tokens, drawn by the whole job so far) and ``weights`` the relative weight of
each source from there on. ``interpolate="step"`` holds a point's weights until the next
point; ``"linear"`` moves linearly from one point's weights to the next. Before the first
point its weights hold, after the last point the last's.

The choice of a source for one draw is :func:`choose`: a pure function of a uniform in
``[0, 1)`` (from the draw's counter and the seed), the weights at the draw's progress and the
sources still active. A mixture's order is so a pure function of the seed, the progress and
the grid (ranks x workers) its draws are split over: nothing depends on time or timing.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardkit.errors import ConfigError
from shardkit.values import as_int, normalised

__all__ = ["INTERPOLATE", "UNITS", "Schedule", "choose"]

UNITS = ("samples", "tokens")
INTERPOLATE = ("step", "linear")

Weights = Sequence[float] | Mapping[str, float]


def _check_weights(raw: Weights, names: Sequence[str] | None, where: str) -> tuple[float, ...]:
    """``raw`` normalised to sum 1 (:func:`shardkit.values.normalised`: finite, non-negative,
    a positive sum); a mapping is read in the order of ``names``."""
    if isinstance(raw, Mapping):
        if names is None:
            raise ConfigError(f"{where}: weights by name need the sources' names")
        unknown = sorted(set(raw) - set(names), key=str)
        if unknown:
            raise ConfigError(f"{where}: weights name unknown sources {unknown} (have {names})")
        return normalised([raw.get(n, 0.0) for n in names], f"{where} {dict(raw)!r}")
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence | np.ndarray):
        raise ConfigError(f"{where}: weights must be a list or a dict of numbers, got {raw!r}")
    return normalised(list(raw), where)


class Schedule:
    """Mixture weights that change with the job's progress.

    Args:
        points: ``[(at, weights), ...]`` with ``at`` (progress, >= 0) non-decreasing;
            ``weights`` a list (one per source) or a dict name -> weight (a missing name
            weighs 0).
        unit: ``"samples"`` or ``"tokens"``: what ``at`` counts (tokens need the token
            field, from ``pack_tokens`` after the mix or ``tokens_field=``).
        interpolate: ``"step"`` (a point's weights hold until the next) or ``"linear"``.

    Example: warm up on web data, then anneal on the high-quality sources::

        sk.Schedule([(0, {"web": 9, "code": 1}), (1_000_000, {"web": 5, "code": 3, "math": 2})])
    """

    def __init__(
        self,
        points: Sequence[tuple[float, Weights]],
        *,
        unit: str = "samples",
        interpolate: str = "step",
    ) -> None:
        if unit not in UNITS:
            raise ConfigError(f"Schedule: unit must be one of {UNITS}, got {unit!r}")
        if interpolate not in INTERPOLATE:
            raise ConfigError(f"Schedule: interpolate must be one of {INTERPOLATE}")
        pts = list(points)
        if not pts:
            raise ConfigError("Schedule: give at least one point (at, weights)")
        ats: list[float] = []
        for i, point in enumerate(pts):
            if not isinstance(point, Sequence) or len(point) != 2:
                raise ConfigError(f"Schedule: point {i} must be a pair (at, weights)")
            at = as_int(point[0], f"Schedule: point {i}: 'at'", low=0)
            if ats and at < ats[-1]:
                raise ConfigError(f"Schedule: point {i}: 'at' {at} is before the point before")
            ats.append(float(at))
        self.unit = unit
        self.interpolate = interpolate
        self._raw = [p[1] for p in pts]
        self._at = ats
        self._weights: list[tuple[float, ...]] = []
        self._points: list[tuple[float, tuple[float, ...]]] | None = None
        if not any(isinstance(w, Mapping) for w in self._raw):
            self._weights = self._resolved(None)

    @classmethod
    def constant(cls, weights: Weights) -> Schedule:
        """Weights that never change."""
        return cls([(0, weights)])

    def _resolved(self, names: Sequence[str] | None) -> list[tuple[float, ...]]:
        out = [_check_weights(w, names, f"Schedule point {i}") for i, w in enumerate(self._raw)]
        if len({len(w) for w in out}) != 1:
            raise ConfigError("Schedule: every point needs one weight per source")
        return out

    def bind(self, names: Sequence[str]) -> Schedule:
        """This schedule for the sources ``names`` (weights by name resolved, counts checked)."""
        new = Schedule.__new__(Schedule)
        new.unit, new.interpolate, new._raw, new._at = (
            self.unit,
            self.interpolate,
            self._raw,
            self._at,
        )
        new._weights = self._resolved(names)
        new._points = None
        if len(new._weights[0]) != len(names):
            raise ConfigError(
                f"Schedule: {len(new._weights[0])} weights per point for {len(names)} sources"
            )
        return new

    @property
    def points(self) -> list[tuple[float, tuple[float, ...]]]:
        """The points, weights normalised to sum 1 (after :meth:`bind` for named weights)."""
        if not self._weights:
            raise ConfigError("Schedule: weights by name: bind() it to the sources' names")
        if self._points is None:  # computed once: weights_at runs for every draw
            self._points = list(zip(self._at, self._weights, strict=True))
        return self._points

    def __len__(self) -> int:
        """The number of sources."""
        return len(self.points[0][1])

    def weights_at(self, progress: float) -> tuple[float, ...]:
        """The normalised weights at ``progress`` (samples or tokens drawn by the job)."""
        pts = self.points
        i = bisect.bisect_right(self._at, progress)
        if i == 0:
            return pts[0][1]
        if i == len(pts) or self.interpolate == "step":
            return pts[i - 1][1]
        (a0, w0), (a1, w1) = pts[i - 1], pts[i]
        f = (progress - a0) / (a1 - a0) if a1 > a0 else 1.0
        return tuple(x + f * (y - x) for x, y in zip(w0, w1, strict=True))

    def next_change(self, progress: float) -> float:
        """The progress after ``progress`` from which the weights may differ (inf: never)."""
        i = bisect.bisect_right(self._at, progress)
        if i >= len(self._at):
            return math.inf
        if self.interpolate == "linear" and i > 0:
            return progress  # they change continuously
        return self._at[i]

    def params(self) -> dict[str, Any]:
        """The schedule as JSON-safe data (what a state's fingerprint holds)."""
        return {
            "unit": self.unit,
            "interpolate": self.interpolate,
            "points": [[a, list(w)] for a, w in self.points],
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.params() == other.params()

    def __hash__(self) -> int:
        return hash(repr(self.params()))

    def __repr__(self) -> str:
        pts = [(a, w) for a, w in zip(self._at, self._raw, strict=True)]
        return f"Schedule({pts!r}, unit={self.unit!r}, interpolate={self.interpolate!r})"


def choose(u: float, weights: Sequence[float], active: Sequence[bool]) -> int | None:
    """The source a draw with uniform ``u`` in ``[0, 1)`` picks: by ``weights`` among the
    ``active`` sources (None when no active source has weight)."""
    total = 0.0
    for w, on in zip(weights, active, strict=True):
        if on:
            total += w
    if total <= 0:
        return None
    target = u * total
    acc = 0.0
    last = None
    for k, (w, on) in enumerate(zip(weights, active, strict=True)):
        if not on or w <= 0:
            continue
        acc += w
        last = k
        if target < acc:
            return k
    return last
