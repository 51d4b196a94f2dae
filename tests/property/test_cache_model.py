"""The model-based test of the node cache (issue 19 item 6), bounded for CI: a seeded
driver over a lying Range server, 3 reader processes sharing one cache dir, SIGKILL and
SIGSTOP at random points, two jobs whose manifests name the same checksums with
different piece tables (see tests/helpers/cache_model.py; the long mode is
scripts/cache_model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cache_model import run_model

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [1, 2])
def test_every_read_is_right_or_a_named_error_within_its_bound(tmp_path: Path, seed: int) -> None:
    report = run_model(tmp_path, seed=seed, steps=120)
    assert report.broken == [], report
    assert report.outcomes.get("a:ok", 0) > 0  # the model did read, through the lies
