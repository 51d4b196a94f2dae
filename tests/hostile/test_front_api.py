"""Hostile: the root's ``sk.end_process_group`` (issue 33 item 3).

A ``settle`` that is not a number of seconds (``-1``, NaN, ``"1"``) raised from
``time.sleep`` after the barrier, the group left alive (a rank out of step with the others
at its end); it is refused by name before the barrier, with or without a group.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch.distributed as dist

import shardkit as sk
from shardkit.errors import ConfigError


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("settle", [-1, float("nan"), float("inf"), "1", None, True])
def test_a_bad_settle_is_refused_before_the_barrier(settle: Any) -> None:
    with pytest.raises(ConfigError, match="settle"):
        sk.end_process_group(settle=settle)  # no group: refused all the same
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match="settle"):
            sk.end_process_group(settle=settle)
        assert dist.is_initialized()  # untouched: the job may still end it
        sk.end_process_group(settle=0)
        assert not dist.is_initialized()
        sk.end_process_group(settle=0)  # twice: a no-op
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
