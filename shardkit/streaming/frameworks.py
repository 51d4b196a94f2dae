"""What a training framework's data loader does with a ShardDataset, found where it calls it.

Hugging Face's ``Trainer`` and ``accelerator.prepare`` wrap a ``torch.utils.data.DataLoader``
over an ``IterableDataset`` in one of two ways, and both split the data between ranks
themselves:

- ``dispatch_batches=True`` (accelerate's default for an iterable data set): rank 0 alone
  reads the data set and sends each rank its slice of every step's batches;
- ``dispatch_batches=False``: every rank reads the whole data set and keeps every
  ``world``-th batch (accelerate's ``IterableDatasetShard``).

A data set that also splits by node then gives rank 0 (or every rank) only its own share,
and the framework splits that share again: data is repeated across epochs or lost:
:func:`check_framework` finds such a wrapper among the callers of ``len()``,
``set_epoch()`` or ``iter()`` (a few frames up: the framework calls these in the main
process of every rank before an epoch) and raises :class:`ConfigError` saying what to
change. And with ``drop_last`` off, both wrappers complete a last, partial step with
samples from the epoch's start: trained twice, while an evaluation loop's
``gather_for_metrics`` drops them again. The wrapper cannot tell which it serves, so that
case is a warning (once per process) naming the count and the fix, not a refusal.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from shardkit.errors import ConfigError

__all__ = ["check_framework", "framework_loader"]

log = logging.getLogger(__name__)
_DEPTH = 12
_warned: set[tuple[int, int]] = set()
_WRAPPERS = {"DataLoaderDispatcher": "dispatch", "IterableDatasetShard": "shard"}


def framework_loader(frame: FrameType | None) -> tuple[str, Any] | None:
    """``("dispatch" | "shard", wrapper)`` when accelerate's loader is among the callers."""
    if "accelerate" not in sys.modules:
        return None
    for _ in range(_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None:
            cls = type(owner)
            kind = _WRAPPERS.get(cls.__name__)
            if kind is not None and cls.__module__.startswith("accelerate"):
                return kind, owner
        frame = frame.f_back
    return None


def _layout(kind: str, wrapper: Any) -> tuple[int, bool, int]:
    """(batch size per rank, drop_last, ranks) of a wrapper."""
    batch = wrapper.batch_size or 1  # None: the data set's items are batches already
    if kind == "shard":
        return int(batch), bool(wrapper.drop_last), int(wrapper.num_processes)
    return int(batch), bool(wrapper._drop_last), int(wrapper.state.num_processes)


def check_framework(splits_by_node: bool, length: Callable[[], int | None]) -> None:
    """Refuse a data set that accelerate's loader (a caller, if any) would read wrongly.

    Args:
        splits_by_node: the data set gives each rank its own share.
        length: the items it yields per epoch in one process (None: not known), asked
            only under such a loader.
    """
    found = framework_loader(sys._getframe(2))
    if found is None:
        return
    kind, wrapper = found
    how = (
        "rank 0 reads it for every rank (accelerate's dispatch_batches)"
        if kind == "dispatch"
        else "every rank reads it whole and keeps its own batches (IterableDatasetShard)"
    )
    if splits_by_node:
        raise ConfigError(
            f"this ShardDataset splits by node, and so does the accelerate/Trainer data "
            f"loader reading it: {how}, so ranks would train on repeated or missing data. "
            "Drop .split_by_node() from a data set given to transformers.Trainer or to "
            "accelerator.prepare(DataLoader(...)); or keep it and pass a sk.WebLoader "
            "(accelerator.prepare leaves it as it is: every rank reads its own share)"
        )
    total = length()
    if total is None:
        return
    batch, drop_last, ranks = _layout(kind, wrapper)
    step = batch * ranks
    if not drop_last and total % step and (total, step) not in _warned:
        _warned.add((total, step))
        log.warning(
            f"the data set has {total} items, not a multiple of the {step} a step takes "
            f"({ranks} ranks x batch {batch}): accelerate would fill the last step with "
            f"{step - total % step} items from the epoch's start, training them twice. "
            "Set drop_last (TrainingArguments(dataloader_drop_last=True), or "
            "DataLoader(drop_last=True)), or choose a batch size that divides it "
            "(an evaluation's gather_for_metrics drops them: nothing to do there)"
        )
