"""Hostile review of issue 32 (retries): a store that answers 429 or 503 for ever ends in
one FetchError by the deadline, naming the url (its signature redacted), the time, the
attempts and the status once (it said 'HTTP 429; HTTP 429; after 1 attempt')."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardkit._types import ObjectRef
from shardkit.errors import FetchError
from shardkit.io import RetryPolicy
from shardkit.io.config import IoConfig
from shardkit.io.remote import UncachedOpener
from tests.helpers.throttle import ThrottlingServer


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["retry-after", "503"])
def test_a_store_throttling_for_ever_is_one_clear_fetch_error(tmp_path: Path, mode: str) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    opener = UncachedOpener(
        IoConfig(retry=RetryPolicy(deadline=1.0, max_attempts=100, backoff_base=0.1))
    )
    with ThrottlingServer(str(tmp_path), rate=1e-6, burst=0, mode=mode) as srv:
        url = srv.url("a.bin") + "?X-Amz-Signature=SECRETSIG&X-Amz-Credential=CREDX"
        start = time.monotonic()
        with pytest.raises(FetchError) as err:
            opener.open(ObjectRef(url, 1000, None)).read()
    assert time.monotonic() - start < 2.0
    msg = str(err.value)
    status = 429 if mode == "retry-after" else 503
    assert msg.count(f"HTTP {status}") == 1, msg
    assert "SECRETSIG" not in msg and "CREDX" not in msg and "giving up after" in msg, msg
    assert srv.url("a.bin") in msg and "attempt" in msg, msg
