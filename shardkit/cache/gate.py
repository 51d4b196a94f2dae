"""One request's turn on the node: every remote request a caching opener makes waits for a
slot of the node's request cap (:class:`~shardkit.cache.locks.NodeSlots`), then for the
node's rate (:class:`~shardkit.io.rate.NodeRate`, the job's ``request_rate`` shared out
over its nodes)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from shardkit.cache.locks import NodeSlots
from shardkit.counters import Counters
from shardkit.io.config import IoConfig
from shardkit.io.rate import Admission, NodeRate
from shardkit.plan.world import WorldInfo

__all__ = ["NodeGate", "nodes"]


class NodeGate:
    """The node's request cap and rate, kept under the cache dir ``root``.

    Args:
        cfg: the io options (``cfg.cache``'s ``node_requests``, ``piece_parallel``,
            ``cache_wait``, ``node_rate``, ``rate_adapt``, ``request_rate``).
        root: the cache dir.
        counters: where the rate counts its waits and throttles.
    """

    def __init__(self, cfg: IoConfig, root: str, counters: Counters) -> None:
        self.capped = bool(cfg.cache.node_requests)
        reserve = cfg.cache.piece_parallel  # slots the background leaves for waiting readers
        # a slot held past twice the read timeout: its holder is stopped (or its request
        # far slower than any other); a request waits at most cache_wait for one
        self.slots = NodeSlots(
            os.path.join(root, "slots"),
            cfg.cache.node_requests,
            reserve,
            wait=cfg.cache.cache_wait,
            lease=2 * cfg.read_timeout,
        )
        self.rate = NodeRate(
            os.path.join(root, "slots", "rate"),
            start=cfg.cache.node_rate
            or (float(cfg.cache.node_requests) if cfg.cache.rate_adapt else 0.0),
            adapt=cfg.cache.rate_adapt,
            wait=cfg.cache.cache_wait,
            counters=counters,
            cap=cfg.cache.request_rate / nodes() if cfg.cache.request_rate else 0.0,
        )

    @contextlib.contextmanager
    def turn(self, urgent: bool, until: float | None) -> Iterator[Admission]:
        """One request's turn on the node: a slot of the cap, then the rate's next start
        (``urgent``: a reader waits for it, see :class:`NodeSlots`)."""
        with contextlib.ExitStack() as held:
            if self.capped:
                held.enter_context(self.slots.slot(urgent=urgent))
            yield held.enter_context(self.rate.gate(until))


def nodes() -> int:
    """How many nodes the job runs on (its world over the ranks of this node)."""
    world = WorldInfo.detect()
    return max(1, world.world_size // world.local_world_size)
