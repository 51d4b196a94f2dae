"""``shardkit inspect``: what a small set's shard sizes get (one note, not a warning per shard)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.cli.inspect import _size_note
from shardkit.format.manifest.model import Manifest

pytestmark = pytest.mark.integration


def test_a_small_set_gets_one_note_not_a_list_of_shards(
    make_shards: Callable[..., Manifest],
) -> None:
    m = make_shards([3, 4, 5, 2])
    res = CliRunner().invoke(cli, ["inspect", str(Path(m.base or "") / "manifest.json")])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if "500 MB-2 GB" in line]
    assert notes == ["  note: a small set, all of it under one shard of the 500 MB-2 GB that "
                     "streams best"]  # fmt: skip
    assert "data-000001.tar" not in res.output


def _summary(sizes: list[int]) -> dict[str, Any]:
    lo, hi = 500_000_000, 2_000_000_000
    outside = [
        {"url": f"s{i}.tar", "size": n, "last": i == len(sizes) - 1}
        for i, n in enumerate(sizes)
        if not lo <= n <= hi
    ]
    return {"shards": len(sizes), "bytes": sum(sizes), "good_shard_bytes": [lo, hi],
            "outside_good_range": outside}  # fmt: skip


def test_the_note_says_what_to_do_once() -> None:
    assert _size_note(_summary([900_000_000, 800_000_000, 10])) is None  # the last one only
    small = _size_note(_summary([100_000_000] * 8))
    assert small == "8 shards under the 500 MB-2 GB that streams best (--maxsize 1GB)"
    mixed = _size_note(_summary([900_000_000, 3_000_000_000, 10, 900_000_000]))
    assert mixed == "2 shards outside 500 MB-2 GB: s1.tar 3.00 GB, s2.tar 10 B"


def test_one_shard_of_one_sample_is_said_in_the_singular(
    make_shards: Callable[..., Manifest],
) -> None:
    from shardkit.units import plural

    assert [plural(n, "shard") for n in (0, 1, 2, 1234)] == [
        "0 shards", "1 shard", "2 shards", "1,234 shards"
    ]  # fmt: skip
    assert plural(1, "index", "indexes") == "1 index"
    assert plural(3, "index", "indexes") == "3 indexes"
    m = make_shards([1])
    res = CliRunner().invoke(cli, ["inspect", str(Path(m.base or "") / "manifest.json")])
    assert "  1 shard, 1 sample, " in res.output, res.output
    assert "1 samples" not in res.output and "1 shards" not in res.output
