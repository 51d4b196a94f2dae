"""Who am I in the job: rank and world size, read once from torch.distributed or torchrun;
and :class:`Context`, where one pipeline iteration runs (rank, world, worker, workers, epoch).

shardkit never invents a cluster layer: it reads an initialised ``torch.distributed``
process group when there is one, else the ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
``LOCAL_WORLD_SIZE`` variables torchrun sets, else it is a single process. This module
does not import torch: it looks for an already imported ``torch.distributed``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from shardkit.errors import ConfigError

__all__ = ["Context", "WorldInfo"]


@overload
def _env_int(env: Mapping[str, str], name: str, default: int) -> int: ...
@overload
def _env_int(env: Mapping[str, str], name: str, default: None) -> int | None: ...
def _env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class WorldInfo:
    """This process's place in a distributed job.

    Args:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of ranks.
        local_rank: rank on this node.
        local_world_size: ranks on this node.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local rank {self.local_rank} is outside local world size {self.local_world_size}"
            )

    @classmethod
    def detect(cls, env: Mapping[str, str] | None = None) -> WorldInfo:
        """Read the world from an initialised process group, else torchrun's variables."""
        env = os.environ if env is None else env
        local_rank = _env_int(env, "LOCAL_RANK", 0)
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", None)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
        else:
            rank = _env_int(env, "RANK", 0)
            world = _env_int(env, "WORLD_SIZE", 1)
        if local_world is None:  # without torchrun's variable assume a single node
            local_world = max(world, local_rank + 1)
        return cls(rank, world, local_rank, local_world)


@dataclass(frozen=True)
class Context:
    """Where one iteration of a pipeline runs: this rank of ``world`` ranks, this worker of
    its ``workers`` workers, in ``epoch``. The one spelling of these five numbers, in this
    order, from the plan to the loader."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world or not 0 <= self.worker < self.workers:
            raise ConfigError(
                f"rank {self.rank}/{self.world} worker {self.worker}/{self.workers} is out of range"
            )
