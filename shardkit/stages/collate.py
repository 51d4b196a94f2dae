"""Batch collation without torch: numpy arrays stack, numbers become arrays, the rest lists.

Samples of one batch need not share their fields (an image set mixing ``jpg`` and
``png``): a dict batch has every field any of its samples has, and a field some samples
lack is a list with ``None`` in their places.

Torch tensors (made by a user's ``map``) are stacked with ``torch.stack`` when torch is
already imported; this module never imports it. The loader turns numpy arrays into
tensors in the worker, so batches cross to the training process in shared memory.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["collate_numpy"]

_NUMBERS = (int, float, np.integer, np.floating, np.bool_)


def collate_numpy(samples: Sequence[Any]) -> Any:
    """Collate a list of samples (dicts, tuples, arrays, numbers, anything) into a batch."""
    first = samples[0]
    if isinstance(first, dict):
        return _collate_dicts(samples)
    if isinstance(first, tuple):
        return tuple(collate_numpy(list(col)) for col in zip(*samples, strict=True))
    if isinstance(first, np.ndarray):
        shape = first.shape
        if all(isinstance(s, np.ndarray) and s.shape == shape for s in samples):
            return np.stack(samples)
        return list(samples)
    if isinstance(first, _NUMBERS) and all(isinstance(s, _NUMBERS) for s in samples):
        return np.asarray(samples)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(first, torch.Tensor):
        shape = first.shape
        if all(isinstance(s, torch.Tensor) and s.shape == shape for s in samples):
            return torch.stack(list(samples))
    return list(samples)


def _collate_dicts(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every field of any sample; one that some samples lack is a list with ``None``."""
    keys = dict.fromkeys(samples[0])
    for s in samples:
        if s.keys() != keys.keys():
            keys.update(dict.fromkeys(s))
    out: dict[str, Any] = {}
    for k in keys:
        if all(k in s for s in samples):
            out[k] = collate_numpy([s[k] for s in samples])
        else:
            out[k] = [s.get(k) for s in samples]
    return out
