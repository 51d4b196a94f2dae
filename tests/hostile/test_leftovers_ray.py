"""Hostile options of ``shardkit.ray.ShardDatasink``: a bad writer option (``maxcount=True``,
an unknown keyword) is a ConfigError when the sink is made, on the driver, not in every
write task's writer. No Ray cluster is started: making the sink needs none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardkit.errors import ConfigError

pytestmark = [
    pytest.mark.integration,  # imports ray (the optional extra the test extra installs)
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"maxcount": True}, "maxcount"),
        ({"maxcount": 2.5}, "maxcount"),
        ({"image_quality": True}, "image_quality"),
        ({"maxsize": "lots"}, "lots"),
        ({"max_count": 3}, "max_count"),
    ],
)
def test_bad_option_is_refused_when_the_sink_is_made(
    tmp_path: Path, options: dict[str, Any], name: str
) -> None:
    from shardkit.ray import ShardDatasink

    with pytest.raises(ConfigError, match=name):
        ShardDatasink(tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()
