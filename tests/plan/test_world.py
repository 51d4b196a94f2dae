"""WorldInfo: rank and world size from torchrun's variables, validated."""

from __future__ import annotations

import pytest

from shardkit.errors import ConfigError
from shardkit.plan.world import WorldInfo


def test_a_plain_process_is_rank_0_of_1() -> None:
    assert WorldInfo.detect({}) == WorldInfo(0, 1, 0, 1)


def test_torchrun_variables_are_read() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert WorldInfo.detect(env) == WorldInfo(5, 8, 1, 4)
    # without LOCAL_WORLD_SIZE a single node is assumed
    assert (
        WorldInfo.detect({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2"}).local_world_size == 3
    )


def test_the_real_environment_is_read_once_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (WorldInfo.detect().rank, WorldInfo.detect().world_size) == (1, 2)


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "x", "WORLD_SIZE": "2"},
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"RANK": "0", "WORLD_SIZE": "0"},
        {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
    ],
)
def test_bad_environments_are_config_errors_naming_the_problem(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"RANK|rank|world size"):
        WorldInfo.detect(env)
