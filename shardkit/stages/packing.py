"""Packing documents into fixed-length sequences: pure maths over token counts, no I/O.

- :func:`pieces`: a document longer than ``seq_len`` cut into ``seq_len``-token pieces and a
  rest, so that every piece fits one sequence.
- :func:`best_fit`: best-fit decreasing over a group of pieces: the longest piece first,
  each into the open sequence with the least room that still holds it (a new one when none
  does). Few pieces are cut, little is padded; the result is a pure function of the lengths.
- :func:`segments_boundaries`: the ``position_ids`` and ``cu_seqlens`` of one sequence made
  of segments (each a run of one document's tokens), for attention that must not cross
  documents (varlen attention takes ``cu_seqlens``).
- :func:`collate_packed`: a batch of such sequences: tokens and position ids stacked, the
  ``cu_seqlens`` of the flattened batch (each sequence's, shifted by its offset).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Segment", "best_fit", "collate_packed", "pieces", "segments_boundaries"]

# one run of one document's tokens in a sequence: (document offset of its first token, length)
Segment = tuple[int, int]


def pieces(length: int, seq_len: int) -> list[Segment]:
    """``(offset, length)`` pieces of a ``length``-token document, none longer than
    ``seq_len`` (whole ``seq_len`` pieces first, the rest last)."""
    out = [(off, seq_len) for off in range(0, length - seq_len + 1, seq_len)]
    done = len(out) * seq_len
    if done < length or length == 0:
        out.append((done, length - done))
    return out


def best_fit(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    """Pack pieces of ``lengths`` (each ``<= seq_len``) into bins of ``seq_len``.

    Best-fit decreasing: pieces by length, longest first (ties: the earlier piece first),
    each into the bin with the least room that holds it (ties: the older bin), else a new
    bin. Returns the bins as lists of piece indices in input order, the bins ordered by
    their first piece (a sequence keeps its documents in the order they came).
    """
    if any(n > seq_len or n < 0 for n in lengths):
        raise ValueError(f"best_fit: every piece must hold 0..{seq_len} tokens")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    room: list[tuple[int, int]] = []  # (room left, bin id), sorted
    bins: list[list[int]] = []
    for i in order:
        n = lengths[i]
        at = bisect.bisect_left(room, (n, -1))
        if at < len(room):
            left, b = room.pop(at)
        else:
            left, b = seq_len, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(room, (left - n, b))
    for members in bins:
        members.sort()
    bins.sort(key=lambda members: members[0])
    return bins


def segments_boundaries(segments: Sequence[Segment], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``position_ids`` (each token's offset in its document: 0 at a document's start) and
    ``cu_seqlens`` (0, the end of every segment, ``seq_len`` last: padding is a segment of
    its own) of one sequence made of ``segments``."""
    pos = np.zeros(seq_len, dtype=np.int64)
    cu = [0]
    at = 0
    for off, n in segments:
        pos[at : at + n] = np.arange(off, off + n)
        at += n
        cu.append(at)
    if at < seq_len:
        pos[at:] = np.arange(seq_len - at)
        cu.append(seq_len)
    return pos, np.asarray(cu, dtype=np.int32)


def collate_packed(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of packed sequences with boundaries: ``tokens`` and ``position_ids`` stacked
    to ``(batch, seq_len)``; ``cu_seqlens`` of the flattened batch (``batch * seq_len``
    tokens), as varlen attention takes it; ``max_seqlen`` its longest segment."""
    tokens = np.stack([s["tokens"] for s in samples])
    seq_len = tokens.shape[1]
    cus = [np.asarray(s["cu_seqlens"])[:-1] + i * seq_len for i, s in enumerate(samples)]
    cu = np.concatenate([*cus, np.asarray([len(samples) * seq_len])]).astype(np.int32)
    return {
        "tokens": tokens,
        "position_ids": np.stack([s["position_ids"] for s in samples]),
        "cu_seqlens": cu,
        "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0,
    }
