"""The idle-share alert: the training loop waited for data too long, for too many steps."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from shardkit.errors import ConfigError

__all__ = ["IdleAlert"]

log = logging.getLogger(__name__)


class IdleAlert:
    """Warn (and call ``callback``) when the loop's idle share stays above ``threshold``.

    The idle share over the last ``steps`` batches is the time the loop waited for them
    divided by the time they took (wait plus the loop's own work). When it passes
    ``threshold`` the alert fires once: a logged warning and ``callback(info)`` with
    ``info = {"idle_share", "threshold", "steps", "step", "wait_mean_s", "step_mean_s"}``;
    it fires again only after the share came back under the threshold. The first batch
    of each iteration (workers starting) is left out: ``first_batch_s`` reports it.

    Args:
        threshold: the idle share that is too much (0.10: the loop waits 10% of its time).
        steps: how many consecutive batches the share is taken over.
        callback: called with ``info`` when the alert fires (in the training process).
    """

    def __init__(
        self,
        threshold: float = 0.10,
        steps: int = 100,
        callback: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if not 0 <= threshold < 1 or steps < 1:
            raise ConfigError(
                f"idle alert: need 0 <= threshold < 1 and steps >= 1, got {threshold}, {steps}"
            )
        self.threshold = threshold
        self.steps = steps
        self.callback = callback
        self.fired = 0
        self._waits: deque[float] = deque(maxlen=steps)
        self._spans: deque[float] = deque(maxlen=steps)
        self._wait_sum = 0.0
        self._span_sum = 0.0
        self._armed = True
        self._step = 0

    def observe(self, wait: float, span: float) -> None:
        """One batch: the loop waited ``wait`` s of the ``span`` s since the last batch."""
        self._step += 1
        if len(self._waits) == self.steps:
            self._wait_sum -= self._waits[0]
            self._span_sum -= self._spans[0]
        self._waits.append(wait)
        self._spans.append(span)
        self._wait_sum += wait
        self._span_sum += span
        if len(self._waits) < self.steps or self._span_sum <= 0:
            return
        share = self._wait_sum / self._span_sum
        if share <= self.threshold:
            self._armed = True
        elif self._armed:
            self._armed = False
            self._fire(share)

    def restart(self) -> None:
        """A new iteration: the steps before it do not count towards the next alert."""
        self._waits.clear()
        self._spans.clear()
        self._wait_sum = self._span_sum = 0.0

    def _fire(self, share: float) -> None:
        self.fired += 1
        info = {
            "idle_share": share,
            "threshold": self.threshold,
            "steps": self.steps,
            "step": self._step,
            "wait_mean_s": self._wait_sum / self.steps,
            "step_mean_s": self._span_sum / self.steps,
        }
        log.warning(
            "the training loop waited for data %.0f%% of its time over the last %d batches "
            "(threshold %.0f%%; mean wait %.1f ms of %.1f ms a step): the data path is the "
            "bottleneck; try more workers (shardkit bench --tune)",
            100 * share,
            self.steps,
            100 * self.threshold,
            1e3 * info["wait_mean_s"],
            1e3 * info["step_mean_s"],
        )
        if self.callback is not None:
            self.callback(info)
