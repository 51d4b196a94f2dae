"""Build functions for ``sk.build(fn, inputs, out)`` tests: importable, so spawned
workers (and a separate script) can use them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np


def three_samples(i: int) -> Iterator[dict[str, Any]]:
    """Input ``i`` gives three samples: a token array, a label, and one without a key."""
    rng = np.random.default_rng(i)
    for j in range(2):
        yield {"__key__": f"in{i:03d}/{j}", "tokens.npy": rng.integers(0, 1000, 50), "cls": i}
    yield {"json": {"input": i}}


def slow_three_samples(i: int) -> Iterator[dict[str, Any]]:
    """:func:`three_samples` at ~20 inputs a second, so a test can kill a build mid-way."""
    time.sleep(0.05)
    yield from three_samples(i)


def fails_on_seven(i: int) -> Iterator[dict[str, Any]]:
    """Like :func:`three_samples`, but input 7 raises."""
    if i == 7:
        raise ValueError("seven is bad")
    yield from three_samples(i)
