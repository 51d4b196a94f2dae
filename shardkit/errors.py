"""The shardkit exception tree.

Every error shardkit raises on purpose derives from :class:`ShardkitError`::

    ShardkitError
    ├── ConfigError (also ValueError)      bad argument, size string, url pattern
    ├── ManifestError                      .path .entry .field
    ├── ShardError                         .url .offset
    │   ├── ShardFormatError               hostile or truncated tar, bad key
    │   └── ChecksumError                  .expected .actual
    ├── FetchError (also OSError)          .url .status .attempts
    ├── CacheError                         lock, disk full, limit below one shard
    ├── DecodeError                        .key .field
    ├── StateDictError (also ValueError)   resume state that does not fit
    └── WriterError

Context lives in attributes and in the message. Errors from libraries are translated
once, at the seam where they happen, and chained with ``raise ... from exc``. A message never
carries a url's credentials: every ShardkitError's text goes through :func:`redact`.
"""

from __future__ import annotations

import re

__all__ = [
    "CacheError",
    "ChecksumError",
    "ConfigError",
    "DecodeError",
    "FetchError",
    "ManifestError",
    "ShardError",
    "ShardFormatError",
    "ShardkitError",
    "StateDictError",
    "TransferError",
    "WriterError",
    "has_userinfo",
    "redact",
]

# user info, to the last ``@`` of the word: plain (``user@``, ``user:pw@``), or with a colon
# before an ``@`` further on (a secret holding ``/``, ``#``, ``?`` or ``@`` unencoded, as AWS
# secret keys hold ``/``); a url with ``:`` and ``@`` in its path loses more than it must
# in a message, never less
_USERINFO = re.compile(r"(?<=://)(?:\S*:\S*|[^/?#\s]*)@")
_SECRET_PARAM = re.compile(
    r"(?i)([?&][^=&#\s]*(?:sig|token|secret|password|credential|key)[^=&#\s]*=)[^&#\s'\"]*"
)


def redact(text: str) -> str:
    """``text`` (a url, or a message holding urls) with its credentials replaced by ``***``:
    the user info of every ``scheme://user:secret@`` and the values of query parameters
    that name a signature, token, key, secret, password or credential (a presigned url)."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub("***@", text))


def has_userinfo(text: str) -> bool:
    """Whether ``text`` holds a url's user info (``scheme://user:secret@``)."""
    return _USERINFO.search(text) is not None


class ShardkitError(Exception):
    """Root of every error shardkit raises on purpose; its message names no credential (a
    presigned url's signature, a token, ``user:secret@``: :func:`redact`), whichever code
    made it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(ShardkitError, ValueError):
    """A bad argument: a size string, a url pattern, an option out of range."""


class ManifestError(ShardkitError):
    """A manifest that cannot be read or does not fit the schema.

    Attributes name where: ``path`` (the manifest), ``entry`` (shard index or CSV line)
    and ``field``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        entry: int | None = None,
        field: str | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if entry is not None:
            where.append(f"entry {entry}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.path = path
        self.entry = entry
        self.field = field


class ShardError(ShardkitError):
    """Something wrong with one shard; ``url`` and byte ``offset`` say where."""

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None) -> None:
        where = []
        if url is not None:
            where.append(str(url))
        if offset is not None:
            where.append(f"byte {offset}")
        prefix = (" at ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.url = url
        self.offset = offset


class ShardFormatError(ShardError):
    """A tar that is truncated, corrupt or hostile, or a key that cannot round-trip."""


class ChecksumError(ShardError):
    """Bytes whose checksum (or size) is not the one the manifest promises."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        expected: str | None = None,
        actual: str | None = None,
        offset: int | None = None,
    ) -> None:
        detail = message
        if expected is not None or actual is not None:
            detail = f"{message} (expected {expected}, found {actual})"
        super().__init__(detail, url=url, offset=offset)
        self.expected = expected
        self.actual = actual


class FetchError(ShardkitError, OSError):
    """A remote read that failed after its retries."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        attempts: int = 1,
    ) -> None:
        parts = [message]
        if status is not None:
            parts.append(f"HTTP {status}")
        parts.append(f"after {attempts} attempt{'s' if attempts != 1 else ''}")
        text = f"{url}: " if url else ""
        super().__init__(text + "; ".join(parts))
        self.url = url
        self.status = status
        self.attempts = attempts

    def __str__(self) -> str:  # OSError's __str__ would show errno formatting
        return str(self.args[0]) if self.args else ""


class CacheError(ShardkitError):
    """The node-local cache cannot do its job: a lock, a full disk, a limit too small."""


class DecodeError(ShardkitError):
    """A field that its codec cannot decode; ``key`` and ``field`` say which."""

    def __init__(self, message: str, *, key: str | None = None, field: str | None = None) -> None:
        where = f"sample {key!r}" if key is not None else ""
        if field is not None:
            where += f" field {field!r}"
        super().__init__(f"{where.strip()}: {message}" if where else message)
        self.key = key
        self.field = field


class StateDictError(ShardkitError, ValueError):
    """A resume state that does not fit the pipeline it is loaded into."""


class TransferError(ShardkitError):
    """A batch that cannot reach the training loop as it was made: a shared segment that
    never arrived, a slot that holds another batch, a batch pickle cannot carry out of a
    worker process, a worker's ``sys.exit()``. Never handed out, never a hang."""


class WriterError(ShardkitError):
    """A sample or option the shard writer cannot write."""
