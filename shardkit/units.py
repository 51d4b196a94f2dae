"""Byte sizes written by people ("1GB", "512MiB") and back; counts as words ("1 shard")."""

from __future__ import annotations

import re

from shardkit.errors import ConfigError

__all__ = ["format_bytes", "parse_size", "plural"]

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | float | str) -> int:
    """Parse ``"1GB"``, ``"512MiB"``, ``"1.5e9"`` or an int into a number of bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if not 0 <= value < float("inf"):  # also refuses NaN
            raise ConfigError(f"not a size: {value!r}")
        if value != int(value):  # 1.5 bytes: meant 1.5GB, or a typo (0.5 would be 0)
            raise ConfigError(f"a size in bytes is whole: {value!r} (with a unit: '{value}GB')")
        return int(value)
    m = _SIZE_RE.match(str(value))
    if m is None:
        try:
            return parse_size(float(value))
        except ValueError:
            raise ConfigError(f"not a size: {value!r} (try '1GB' or '512MiB')") from None
    unit = m.group(2).upper()
    if unit not in _UNITS:
        raise ConfigError(f"unknown size unit {m.group(2)!r} in {value!r}")
    n = float(m.group(1)) * _UNITS[unit]
    return parse_size(n if _UNITS[unit] == 1 else float(int(n)))  # 1.0001KB: 1000 bytes


def format_bytes(n: float) -> str:
    """Format a byte count for people: ``1.50 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"  # pragma: no cover


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and the word for that many: ``1 sample``, ``2 samples``, ``3 indexes``
    (``many``, when adding ``s`` is wrong), with thousands separators."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
