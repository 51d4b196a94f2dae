"""The shuffle buffer, computed in index space: pure maths over stream positions.

A worker reads its stream (positions ``0, 1, 2, ...`` of its plan) sequentially. The
shuffled output order is the stream sorted by a key ``key(s) = s + w(s) * u(s)`` where
``u(s)`` in ``[0, 1)`` comes from a counter-based hash of ``(stream seed, s)`` and the
window ``w(s) = min(bufsize, initial + s)`` is at most ``bufsize``. Because
``s <= key(s) < s + bufsize``:

- output ``p`` comes from input ``<= p + bufsize`` and the reader never holds more than
  ``bufsize`` samples (a sample can be emitted once every input with a smaller key, all
  below position ``key``, has been read);
- the order is a pure function of the stream seed, so the shuffle's state is a cursor:
  "``p`` outputs emitted, the last was stream position ``s``". Resuming from it looks at
  a window of ``bufsize`` positions only, whatever ``p`` is; the ``s`` of a given ``p`` is
  found by a binary search that also looks at ``O(bufsize)`` positions per step.

Compared with WebDataset's swap-remove buffer this bounds how far a sample moves (both
ways) by ``bufsize``; neighbours in the input land about ``bufsize / 3`` apart.
``initial`` shrinks the window at the start of the stream (the first output is drawn
from the first ``initial`` inputs); WebDataset's startup wait is not needed here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError

__all__ = [
    "Window",
    "iter_order",
    "nth_output",
    "remaining_after",
    "remaining_after_many",
    "resume_window",
    "stream_seed",
    "uniforms",
]

_CHUNK = 1 << 16
_EMPTY = np.empty(0, dtype=np.int64)
_C0 = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def stream_seed(*words: int) -> int:
    """A 64-bit seed from integers, via numpy's SeedSequence (never time or pid)."""
    state = np.random.SeedSequence([int(w) & 0xFFFFFFFFFFFFFFFF for w in words])
    return int(state.generate_state(1, dtype=np.uint64)[0])


def uniforms(seed: int | np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Floats in ``[0, 1)``, one per counter: splitmix64 of ``seed + counter`` (``seed``
    may be an array that broadcasts against ``counters``: a seed per row)."""
    z = counters.astype(np.uint64) * _C0 + np.asarray(seed, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Window:
    """A shuffle window over one stream.

    Args:
        bufsize: the largest distance a sample moves and the most samples held.
        initial: the window at the start of the stream grows from this to ``bufsize``.
        seed: the stream's seed (from ``(seed, epoch, generation, rank, worker)``).
    """

    bufsize: int
    initial: int
    seed: int

    def __post_init__(self) -> None:
        if self.bufsize < 1:
            raise ConfigError(f"shuffle bufsize must be at least 1, got {self.bufsize}")
        if not 1 <= self.initial <= self.bufsize:
            raise ConfigError(
                f"shuffle initial must be between 1 and bufsize={self.bufsize}, got {self.initial}"
            )

    def keys(self, positions: np.ndarray) -> np.ndarray:
        """The sort key of each stream position."""
        if self.initial >= self.bufsize:
            width: np.ndarray | float = float(self.bufsize)
        else:
            width = np.minimum(self.bufsize, self.initial + positions).astype(np.float64)
        return positions + width * uniforms(self.seed, positions)

    def key(self, position: int) -> float:
        return float(self.keys(np.array([position], dtype=np.int64))[0])


def _count_below(window: Window, n: int | None, t: int) -> int:
    """How many stream positions have a key below the integer ``t``."""
    lo = max(0, t - window.bufsize)
    hi = t if n is None else min(n, t)
    if hi <= lo:
        return hi if n is not None and hi < lo else lo
    pos = np.arange(lo, hi, dtype=np.int64)
    return lo + int(np.count_nonzero(window.keys(pos) < t))


def nth_output(n: int | None, window: Window | None, p: int) -> int:
    """The stream position of output ``p`` (0-based) of a stream of length ``n``."""
    if n is not None and not 0 <= p < n:
        raise IndexError(f"output {p} of a stream of {n}")
    if window is None:
        return p
    lo, hi = 0, p + window.bufsize + 1  # _count_below(hi) > p: all below hi-bufsize count
    while hi - lo > 1:  # invariant: count(lo) <= p < count(hi)
        mid = (lo + hi) // 2
        if _count_below(window, n, mid) <= p:
            lo = mid
        else:
            hi = mid
    start = max(0, lo - window.bufsize)
    stop = lo + 1 if n is None else min(n, lo + 1)
    pos = np.arange(start, stop, dtype=np.int64)
    keys = window.keys(pos)
    sel = (keys >= lo) & (keys < lo + 1)
    cand, ckeys = pos[sel], keys[sel]
    order = np.argsort(ckeys, kind="stable")
    return int(cand[order][p - _count_below(window, n, lo)])


def _resume_point(window: Window, after: int) -> tuple[float, int]:
    """The key of stream position ``after`` and the first position not surely emitted."""
    k = window.key(after)
    return k, max(0, math.floor(k) - window.bufsize)


def iter_order(
    n: int | None, window: Window | None, *, after: int = -1, chunk: int = _CHUNK
) -> Iterator[np.ndarray]:
    """Yield the stream positions in output order, in chunks, after output position ``after``.

    ``after`` is the stream position of the last output already emitted (-1: none).
    """
    if window is None:
        a = after + 1
        while n is None or a < n:
            b = a + chunk if n is None else min(n, a + chunk)
            yield np.arange(a, b, dtype=np.int64)
            a = b
        return
    chunk = max(chunk, 2 * window.bufsize)
    a, k_last = 0, -1.0
    if after >= 0:
        k_last, a = _resume_point(window, after)
    carry_p, carry_k = _EMPTY, np.empty(0, dtype=np.float64)
    while n is None or a < n:
        b = a + chunk if n is None else min(n, a + chunk)
        pos = np.arange(a, b, dtype=np.int64)
        keys = window.keys(pos)
        if after >= 0 and a <= k_last:
            fresh = (keys > k_last) | ((keys == k_last) & (pos > after))
            pos, keys = pos[fresh], keys[fresh]
        all_p = np.concatenate((carry_p, pos))
        all_k = np.concatenate((carry_k, keys))
        # every later position has a key >= b, so keys below b are final
        last = n is not None and b >= n
        done = np.ones(len(all_p), dtype=bool) if last else all_k < b
        out_p, out_k = all_p[done], all_k[done]
        if len(out_p):
            yield out_p[np.argsort(out_k, kind="stable")]
        carry_p, carry_k = all_p[~done], all_k[~done]
        a = b


def remaining_after(n: int, window: Window | None, p: int) -> tuple[np.ndarray, int]:
    """What is left of a stream after ``p`` outputs: scattered positions and a tail start.

    Returns ``(scattered, tail)``: the positions below ``tail`` not yet emitted (sorted)
    and the first position from which everything is still to come.
    """
    if p <= 0:
        return _EMPTY, 0
    if p >= n:
        return _EMPTY, n
    last = nth_output(n, window, p - 1)
    if window is None:
        return _EMPTY, last + 1
    _, left, hi = resume_window(n, window, last)
    return left, hi


def resume_window(n: int | None, window: Window, after: int) -> tuple[int, np.ndarray, int]:
    """Where a reader resumes after output stream position ``after``.

    Returns ``(start, left, stop)``: reading restarts at ``start``; of the positions in
    ``[start, stop)`` only ``left`` are still to come; every position from ``stop`` on is.
    """
    k_last, lo = _resume_point(window, after)
    hi = math.floor(k_last) + 1
    if n is not None:
        hi = min(n, hi)
    pos = np.arange(lo, hi, dtype=np.int64)
    keys = window.keys(pos)
    left = pos[(keys > k_last) | ((keys == k_last) & (pos > after))]
    return lo, left, hi


def _row_keys(bufsize: int, initial: int, seeds: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:meth:`Window.keys` for a block of streams at once: row ``i`` uses ``seeds[i]``."""
    if initial >= bufsize:
        width: np.ndarray | float = float(bufsize)
    else:
        width = np.minimum(bufsize, initial + pos).astype(np.float64)
    u = uniforms(seeds[:, None], pos)
    out: np.ndarray = pos + width * u
    return out


def remaining_after_many(
    lengths: np.ndarray,
    emitted: np.ndarray,
    bufsize: int,
    initial: int,
    seeds: np.ndarray,
    *,
    block: int = 1 << 22,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`remaining_after` for many streams of one window size, vectorised.

    Stream ``i`` has ``lengths[i]`` positions, ``emitted[i]`` outputs were emitted and its
    window seed is ``seeds[i]``. Returns ``(stream, scattered, tails)``: the positions not
    yet emitted below ``tails[i]`` (``scattered`` with their stream in ``stream``, sorted by
    stream then position) and, per stream, the position from which everything is left.

    The ``p`` emitted outputs are the ``p`` smallest ``(key, position)``: every position
    below ``p - 1 - bufsize`` is among them and none from ``p + bufsize + 1`` on, so one
    selection over ``2 * bufsize + 2`` positions per stream finds them.
    """
    n, p = lengths.astype(np.int64), np.minimum(emitted.astype(np.int64), lengths)
    tails = np.where(p <= 0, 0, np.minimum(n, p + bufsize + 1))
    busy = np.flatnonzero((p > 0) & (p < n))
    width = 2 * bufsize + 2
    rows_out: list[np.ndarray] = []
    pos_out: list[np.ndarray] = []
    step = max(1, block // width)
    offsets = np.arange(width, dtype=np.int64)
    for a in range(0, len(busy), step):
        rows = busy[a : a + step]
        pos = (p[rows] - 1 - bufsize)[:, None] + offsets[None, :]
        inside = (pos >= 0) & (pos < n[rows][:, None])
        keys = _row_keys(bufsize, initial, seeds[rows], pos)
        keys = np.where(pos < 0, -np.inf, np.where(inside, keys, np.inf))
        kth = np.partition(keys, bufsize, axis=1)[:, bufsize : bufsize + 1]
        done = keys < kth
        # ties at the b-th key go in position order, as a stable sort would take them
        ties = keys == kth
        need = (bufsize + 1) - done.sum(axis=1, keepdims=True)
        done |= ties & (np.cumsum(ties, axis=1) <= need)
        r, c = np.nonzero(inside & ~done)
        rows_out.append(rows[r])
        pos_out.append(pos[r, c])
    if not rows_out:
        return _EMPTY, _EMPTY, tails
    return np.concatenate(rows_out), np.concatenate(pos_out), tails
