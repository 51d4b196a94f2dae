"""Hostile options of a build: a count, a worker count or an image quality that is no int
(``maxcount=True``, ``2.5``, ``"3"``) is a ConfigError naming the option before the output
folder is made (it failed only in the worker's writer and left an empty folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardkit as sk
from shardkit.errors import ConfigError
from shardkit.format.images import ImageOptions

BAD: list[tuple[str, dict[str, Any]]] = [
    ("maxcount", {"maxcount": True}),
    ("maxcount", {"maxcount": 2.5}),
    ("maxcount", {"maxcount": "3"}),
    ("workers", {"workers": True}),
    ("workers", {"workers": 1.5}),
    ("quality", {"image": ImageOptions(quality=True)}),  # type: ignore[arg-type]
    ("quality", {"image": ImageOptions(quality="90")}),  # type: ignore[arg-type]
    ("maxside", {"image": ImageOptions(maxside=2.5)}),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "options"), BAD)
def test_bad_option_is_refused_before_the_output_is_made(
    tmp_path: Path, name: str, options: dict[str, Any]
) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "x"}\n{"text": "y"}\n')
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=name):
        sk.build([str(src)], str(out), progress=False, **options)
    assert not out.exists()


def test_an_integral_option_still_builds(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "x"}\n{"text": "y"}\n{"text": "z"}\n')
    res = sk.build([str(src)], str(tmp_path / "out"), progress=False, maxcount=2)
    assert [e.nsamples for e in res.manifest] == [2, 1]
