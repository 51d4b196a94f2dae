"""The package version, in the lowest layer so that any module may record it."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
