"""Typed entry checks: what a public entry takes as a number, a position or a weight.

Python takes many values for an int that are not one (``True``, ``1.7``, ``"3"``), and
numpy adds its own scalars; an entry that reads one of them as another kind of value hands
on wrong data with no error. Every public entry that takes a count, a position, a step or
a set of weights checks it here, once, where it arrives:

- :func:`as_position`: a sequence position (``ds[i]``): ints and numpy integers, never a
  bool, a float or a string (:class:`TypeError`); out of range an :class:`IndexError`
  naming the length.
- :func:`as_int`: a count, a step, a seed or an epoch given as configuration: ints, numpy
  integers (and, where asked, integral floats such as ``1e6``), never a bool, a string,
  NaN, inf or ``2.5`` (:class:`ConfigError`).
- :func:`typed_fields`: a frozen dataclass of options (``IoConfig``'s): each field
  annotated ``int``, ``float``, ``bool`` or ``str`` holds one (``allow_pipe="false"`` is
  no ``False``, ``max_attempts=2.5`` no count, ``read_timeout=nan`` no time,
  ``endpoint_url=123`` no url).
- :func:`normalised`: weights as exact fractions of their sum (``[1e308, 1e308]`` is
  ``[0.5, 0.5]``), refusing NaN, inf, negatives, an all-zero set and a positive weight
  too small beside the others to be represented (it would be drawn never).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardkit.errors import ConfigError

__all__ = ["as_int", "as_position", "is_integer", "normalised", "typed_fields"]


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an int or a numpy integer (a bool is not)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def as_position(value: Any, length: int, what: str = "index") -> int:
    """``value`` as a position in ``range(length)`` (negative from the end)."""
    if not is_integer(value):
        raise TypeError(
            f"{what} must be an int (or a numpy integer), not {type(value).__name__} {value!r}"
        )
    i = operator.index(value)
    if not -length <= i < length:
        raise IndexError(f"{what} {i} is out of range for {length} samples")
    return i % length if length else i


def as_int(value: Any, what: str, *, low: int | None = None, floats: bool = True) -> int:
    """``value`` as an int ``>= low``: an int, a numpy integer or (``floats``) an integral
    float such as ``1e6``."""
    if is_integer(value):
        n = operator.index(value)
    elif (
        floats
        and isinstance(value, float | np.floating)
        and math.isfinite(value)
        and value == int(value)
    ):
        n = int(value)
    else:
        raise ConfigError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    if low is not None and n < low:
        raise ConfigError(f"{what} must be >= {low}, got {n}")
    return n


def typed_fields(options: Any) -> None:
    """Check (and set, integers as ``int``) each field of the dataclass ``options``
    annotated ``int``, ``float``, ``bool`` or ``str`` (or ``... | None``): an integer (an
    integral float taken), a real number other than NaN (inf taken), ``True`` or ``False``,
    text."""
    name = type(options).__name__
    for f in dataclasses.fields(options):
        kind, _, rest = str(f.type).partition(" | ")
        value = getattr(options, f.name)
        if value is None and rest == "None":
            continue
        if kind == "int":
            object.__setattr__(options, f.name, as_int(value, f"{name}: {f.name}"))
        elif kind == "float" and (
            isinstance(value, bool | np.bool_)
            or not isinstance(value, int | float | np.integer | np.floating)
            or math.isnan(value)
        ):
            raise ConfigError(f"{name}: {f.name} must be a number, got {value!r}")
        elif kind == "bool" and not isinstance(value, bool | np.bool_):
            raise ConfigError(f"{name}: {f.name} must be True or False, got {value!r}")
        elif kind == "str" and not isinstance(value, str):  # endpoint_url=123, verify=True
            text = "text or None" if rest == "None" else "text"
            raise ConfigError(
                f"{name}: {f.name} must be {text}, got {type(value).__name__} {value!r}"
            )


def normalised(weights: Sequence[Any], what: str) -> tuple[float, ...]:
    """``weights`` divided by their sum, exactly where floats allow: finite, non-negative,
    with a positive sum, each positive weight still positive after the division."""
    values: list[float] = []
    for w in weights:
        if isinstance(w, bool | np.bool_) or not isinstance(w, int | float | np.number):
            raise ConfigError(f"{what}: weights must be numbers, got {w!r} in {list(weights)!r}")
        try:
            values.append(float(w))
        except (OverflowError, TypeError):  # an int past float's range, a complex
            raise ConfigError(f"{what}: weight {w!r} is not a finite real number") from None
    bad = [w for w in values if not math.isfinite(w) or w < 0]
    if not values or bad or max(values) <= 0:
        raise ConfigError(
            f"{what}: need finite weights >= 0 with a positive sum, got {list(weights)!r}"
        )
    top = max(values)
    scaled, total = values, sum(values)
    if not math.isfinite(total):  # the sum overflows: scaled by the largest, it cannot
        scaled = [w / top for w in values]
        total = sum(scaled)
    out = tuple(w / total for w in scaled)
    lost = [weights[i] for i, w in enumerate(out) if values[i] > 0 and w == 0]
    if lost:
        raise ConfigError(
            f"{what}: weight(s) {lost} are too small beside {top} to be drawn at all "
            f"(weights {list(weights)!r}): give 0 to leave a source out"
        )
    return out
