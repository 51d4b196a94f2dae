"""The shared epoch end: under a process group a batch is handed out only when every rank
has one, so ranks yield the same number of batches whatever the pipeline does."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from shardkit.errors import ConfigError

__all__ = ["EpochEnd", "end_process_group"]


class EpochEnd:
    """The shared end of an epoch under a process group: before each batch is handed out,
    one all_reduce of three int64 (this rank has no batch; its skipped samples and shards)
    on a CPU (gloo) group decides whether every rank has one. When one rank's data ends,
    the epoch ends for all, so ranks never yield different numbers of batches."""

    def __init__(self) -> None:
        self._group: Any = None
        self._made = False
        # the last vote, kept: the tensor's last reference is then never dropped by gloo's
        # worker thread (which needs the GIL for it: see end_process_group)
        self._last: tuple[torch.Tensor, Any] | None = None

    @staticmethod
    def active(mode: bool | None) -> bool:
        if mode is False or not dist.is_available() or not dist.is_initialized():
            if mode is True:
                raise ConfigError("WebLoader(sync=True) needs an initialised process group")
            return False
        return dist.get_world_size() > 1

    def group(self) -> Any:
        """The default group when it runs gloo for CPU tensors, else a gloo group of our own
        (made once, by every rank at its first iteration, as new_group requires)."""
        if not self._made:
            backend = str(dist.get_backend())
            self._group = None if "gloo" in backend else dist.new_group(backend="gloo")
            self._made = True
        return self._group

    def start(self, have: bool, skips: Sequence[int]) -> tuple[torch.Tensor, Any]:
        """Begin the vote on the next batch (asynchronous: it runs while the training step
        on the current batch does)."""
        t = torch.tensor([0 if have else 1, *skips], dtype=torch.int64)
        vote = (t, dist.all_reduce(t, group=self.group(), async_op=True))
        self._last = vote
        return vote

    @staticmethod
    def finish(vote: tuple[torch.Tensor, Any]) -> tuple[bool, list[int]]:
        """``(every rank has its batch, skips summed over ranks)``."""
        t, work = vote
        work.wait()
        return int(t[0]) == 0, [int(x) for x in t[1:]]

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj, group=self.group())
        return out


def end_process_group(settle: float = 0.5) -> None:
    """End the default process group at the end of a job: a barrier, then ``settle`` seconds
    with the GIL released, then ``destroy_process_group``.

    gloo's worker thread frees a finished collective (a barrier holds the collectives before
    it) and the tensors it held, which needs the GIL; a process group destroyed later, at
    interpreter exit or with a DDP model's reducer, joins that thread while holding the GIL,
    and both wait forever (seen as ``~ProcessGroupGloo`` joining a thread stuck in
    ``~AsyncBarrierWork``). The pause lets the thread finish first. No-op without a group.
    """
    if isinstance(settle, bool) or not isinstance(settle, int | float) or not 0 <= settle < 3600:
        raise ConfigError(f"end_process_group: settle must be seconds in [0, 3600), got {settle!r}")
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    time.sleep(settle)
    dist.destroy_process_group()
