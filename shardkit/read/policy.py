"""What a pipeline does with bad data: the ``handler`` policy.

- ``"raise"`` (default): the error propagates.
- ``"warn"`` (alias ``"warn_and_continue"``): log a warning and drop as little as can be
  dropped: a sample that does not decode is dropped alone; a shard that cannot be read
  (missing, truncated, hostile, checksum mismatch) loses the rest of its samples.
- ``"skip_shard"``: log a warning and drop the rest of the shard on any data error,
  a decode error included.

Only data errors (:class:`ShardError`, :class:`FetchError`, :class:`DecodeError`) are
handled; bugs always propagate. Every drop is counted (``skipped_shards``,
``skipped_samples``) and shows in the loader's stats: nothing is skipped silently.

Under DDP a drop makes that rank's data shorter than the others': the loader's shared
epoch end (:class:`~shardkit.WebLoader`) stops the epoch on every rank when the first one
runs out, so ranks stay in step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shardkit.errors import (
    ChecksumError,
    ConfigError,
    DecodeError,
    FetchError,
    ShardError,
    ShardFormatError,
)

__all__ = ["DATA_ERRORS", "POLICIES", "check_policy", "count_error", "report"]

log = logging.getLogger(__name__)

POLICIES = ("raise", "warn", "skip_shard")
_ALIASES = {"warn_and_continue": "warn", "reraise": "raise", "reraise_exception": "raise"}
_FUNCTIONS = {
    "reraise_exception": "raise",
    "warn_and_continue": "warn",
    "ignore_and_continue": "warn",
}
DATA_ERRORS = (ShardError, FetchError, DecodeError)


def check_policy(handler: str | Callable[[BaseException], Any]) -> str:
    """The canonical name of a ``handler`` policy; :class:`ConfigError` if unknown.

    webdataset's handler functions are taken by name, for code moving over:
    ``reraise_exception`` is ``"raise"``; ``warn_and_continue`` and
    ``ignore_and_continue`` are ``"warn"`` (a drop is logged and counted here, never silent).
    """
    if callable(handler):
        fn = getattr(handler, "__name__", "")
        if fn not in _FUNCTIONS:
            raise ConfigError(
                f"handler must be one of {POLICIES} or webdataset's "
                f"{sorted(_FUNCTIONS)}, got the function {handler!r}: shardkit's policies "
                "decide what a data error drops, not a callback"
            )
        return _FUNCTIONS[fn]
    name = _ALIASES.get(handler, handler)
    if name not in POLICIES:
        raise ConfigError(f"handler must be one of {POLICIES}, got {handler!r}")
    return name


def report(policy: str, exc: BaseException, dropped: str) -> None:
    """Log a handled data error under ``policy`` (the caller counts it)."""
    log.warning("skipping %s (handler=%s): %s", dropped, policy, exc)


_KINDS = (
    (ChecksumError, "checksum"),
    (ShardFormatError, "format"),
    (FetchError, "fetch"),
    (DecodeError, "decode"),
)


def count_error(counts: dict[str, float], exc: BaseException) -> None:
    """Count a handled data error by kind (``errors_checksum``, ``errors_format``,
    ``errors_fetch``, ``errors_decode``, ``errors_other``) for the loader's stats."""
    kind = next((k for cls, k in _KINDS if isinstance(exc, cls)), "other")
    counts[f"errors_{kind}"] = counts.get(f"errors_{kind}", 0.0) + 1
