"""The one resume contract every stateful stage meets: ``assert_resumable(make_pipeline)``.

For each stop point: iterate a fresh pipeline ``stop`` items, save its state (through a
JSON round trip, as a checkpoint would), keep going and check the tail equals the
uninterrupted run's; then load the state into another fresh pipeline and check that
it yields exactly the same tail.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["Resumable", "assert_resumable", "canon", "take"]


class Resumable(Protocol):
    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def canon(item: Any) -> Any:
    """A hashable, comparable form of an item (arrays and tensors by dtype, shape, bytes)."""
    if hasattr(item, "detach") and hasattr(item, "numpy"):
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        return ("nd", str(item.dtype), item.shape, item.tobytes())
    if isinstance(item, np.generic):
        return item.item()
    if isinstance(item, Mapping):
        return tuple(sorted((k, canon(v)) for k, v in item.items()))
    if isinstance(item, (list, tuple)):
        return tuple(canon(x) for x in item)
    if isinstance(item, memoryview):
        return bytes(item)
    return item


def take(it: Iterator[Any], n: int) -> list[Any]:
    """The next ``n`` items of ``it`` (fewer if it ends), canonical."""
    out = []
    for _ in range(n):
        try:
            out.append(canon(next(it)))
        except StopIteration:
            break
    return out


def assert_resumable(
    make_pipeline: Callable[[], Resumable],
    *,
    stops: Sequence[int] | None = None,
    rounds: int = 3,
    seed: int = 0,
    prepare: Callable[[Resumable], None] | None = None,
) -> list[Any]:
    """Check save-midway / restore / compare-tails for ``make_pipeline``; return the full run.

    ``stops`` default: 0, the end, and ``rounds`` random points in between. ``prepare``
    is applied to every fresh pipeline before use (e.g. ``set_epoch``).
    """

    def fresh() -> Resumable:
        p = make_pipeline()
        if prepare is not None:
            prepare(p)
        return p

    full = [canon(x) for x in fresh()]
    assert full, "the pipeline yields nothing: nothing to resume"
    if stops is None:
        rng = random.Random(seed)
        stops = sorted({0, len(full), *(rng.randrange(len(full)) for _ in range(rounds))})
    for stop in stops:
        p = fresh()
        it = iter(p)
        head = take(it, stop)
        assert head == full[:stop], f"stop {stop}: the run differs from the reference"
        state = json.loads(json.dumps(p.state_dict()))
        assert take(it, len(full)) == full[stop:], f"stop {stop}: saving changed the run"
        q = fresh()
        q.load_state_dict(state)
        tail = [canon(x) for x in q]
        diff = [i for i, (a, b) in enumerate(zip(tail, full[stop:], strict=False)) if a != b]
        assert tail == full[stop:], (
            f"stop {stop}: the restored run yields {len(tail)} items, expected "
            f"{len(full) - stop}; first difference at {diff[:1]}"
        )
    return full
