"""Spawn a gloo job of ``world`` ranks on 127.0.0.1 and collect what each rank wrote."""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

RankFn = Callable[[int], dict[str, Any]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _main(rank: int, fn: RankFn, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    try:
        result = fn(rank)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")


def run_ranks(fn: RankFn, world: int, out: Path) -> list[dict[str, Any]]:
    """Run ``fn(rank)`` (a module-level function) in ``world`` spawned ranks under an
    initialised gloo group; every rank's JSON-safe result, by rank."""
    mp.spawn(_main, args=(fn, world, _free_port(), str(out)), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
