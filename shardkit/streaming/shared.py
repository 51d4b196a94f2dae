"""Shared memory the loader makes once: zero-filled segments (:func:`shared_bytes`, the
arenas' slots and control blocks) and the :class:`Mailbox` that tells persistent workers
what to iterate and from where before every ``iter()``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from shardkit.errors import StateDictError

__all__ = ["CapBoard", "Mailbox", "shared_bytes"]

_MAILBOX = 1 << 18


def shared_bytes(n: int) -> torch.Tensor:
    """A uint8 tensor of zeros made in shared memory (a new shared file reads as zeros;
    ``share_memory_()`` would allocate, then copy)."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # pragma: no cover - older or newer torch
        fallback: torch.Tensor = torch.zeros(n, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]
        return fallback
    out: torch.Tensor = torch.empty(0, dtype=torch.uint8).set_(new_shared(n))
    return out


class Mailbox:
    """JSON from the loader to its workers through a shared uint8 tensor."""

    def __init__(self, capacity: int = _MAILBOX) -> None:
        # made in shared memory, zero-filled by the system: torch.zeros then share_memory_()
        # filled it (starting torch's thread pool) and copied it, 15-30 ms of the first batch
        self.buf = shared_bytes(capacity + 8)

    def write(self, obj: Mapping[str, Any]) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if len(data) > len(self.buf) - 8:
            raise StateDictError(f"loader: the resume state is too large ({len(data)} bytes)")
        view = self.buf.numpy()
        view[8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        view[:8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)

    def read(self) -> dict[str, Any]:
        view = self.buf.numpy()
        n = int.from_bytes(view[:8].tobytes(), "little")
        out: dict[str, Any] = json.loads(view[8 : 8 + n].tobytes())
        return out


class CapBoard:
    """Two words the training process writes once an epoch and worker processes read
    before each bundle: from the ``index``-th bundle of every worker on, bundles hold at
    most ``cap`` batches (:mod:`shardkit.streaming.bundles`). Every worker reads the same
    words for the same bundle, because the training process publishes them for an index no
    worker has been asked for yet, and a worker starts a bundle only once asked for it
    (the request's pipe orders the write before the read)."""

    def __init__(self) -> None:
        self.words = shared_bytes(16).view(torch.int64)

    def clear(self) -> None:
        """No cap published (an epoch's start)."""
        self.words[0] = 0

    def publish(self, index: int, cap: int) -> None:
        self.words[1] = cap
        self.words[0] = index

    def cap_at(self, index: int, default: int) -> int:
        """The cap of a worker's ``index``-th bundle (``default`` before one is published)."""
        start = int(self.words[0])
        return int(self.words[1]) if 0 < start <= index else default
