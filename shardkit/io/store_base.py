"""What a writer needs of an object store (``s3://``, ``gs://``, ``az://``), whichever it is:
an :class:`ObjectStore` puts small objects whole, streams big ones up through an
:class:`Upload` (one part in memory; the object appears only at :meth:`Upload.complete`),
gets, lists, deletes and creates an object only where there is none (a conditional put).
The stores themselves are in :mod:`shardkit.io.store_s3`, :mod:`shardkit.io.store_gs` and
:mod:`shardkit.io.store_az`; :func:`shardkit.io.stores.open_store` picks one for a url.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from shardkit.counters import Counters
from shardkit.io.clocked import retried
from shardkit.io.rate import NodeRate
from shardkit.io.retry import Retryable, RetryPolicy
from shardkit.urls import OBJECT_SCHEMES, url_scheme

__all__ = [
    "DEFAULT_PART_SIZE",
    "RETRY_STATUS",
    "STALE_UPLOAD_AGE",
    "ObjectInfo",
    "ObjectStore",
    "Upload",
    "is_object_url",
]

DEFAULT_PART_SIZE = 8 << 20  # S3's smallest part is 5 MiB; GCS wants multiples of 256 KiB
STALE_UPLOAD_AGE = 6 * 3600.0
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # a write answered so is tried again
T = TypeVar("T")


def is_object_url(target: object) -> bool:
    """True for ``s3://``, ``gs://`` and ``az://`` urls (a writer's object-store target)."""
    return isinstance(target, str) and url_scheme(target) in OBJECT_SCHEMES


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key, size and the store's tag of its content version (ETag)."""

    key: str
    size: int
    etag: str


class Upload:
    """A streaming upload of one object: :meth:`write` as to a file, then :meth:`complete`
    (the object appears whole) or :meth:`abort` (nothing appears)."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self._buf = bytearray()
        self.size = 0
        self.done = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.done:
            raise ValueError("write to a finished upload")
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= self.part_size:
            part = bytes(self._buf[: self.part_size])
            del self._buf[: self.part_size]
            self._send(part)
        return len(data)

    def flush(self) -> None:
        pass  # parts go out when full; a flush cannot send a short part mid-object

    def complete(self) -> str:
        """Send what is left and make the object appear; its ETag."""
        self.done = True
        etag = self._finish(bytes(self._buf))
        self._buf = bytearray()
        return etag

    def abort(self) -> None:
        """Drop the upload: no object appears (idempotent)."""
        if not self.done:
            self.done = True
            self._buf = bytearray()
            self._drop()

    def _send(self, part: bytes) -> None:
        raise NotImplementedError

    def _finish(self, last: bytes) -> str:
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError


class ObjectStore:
    """One bucket (or container) of an object store, seen through a key prefix.

    Every write request (a part, a chunk, a block, a commit, a small object) is retried
    on 429, 5xx, ``SlowDown`` and dropped connections under ``retry``, as reads are
    (:func:`shardkit.io.clocked.retried`; the SDKs' own retries are off for them, so each
    try is counted once, in ``counters``), through the node's write rate for the store
    (:attr:`rate`), and fails with a FetchError naming the object, the attempts and the
    time."""

    scheme = ""

    def __init__(
        self, bucket: str, *, part_size: int = DEFAULT_PART_SIZE, retry: RetryPolicy | None = None
    ) -> None:
        self.bucket = bucket
        self.part_size = part_size
        self.retry = retry or RetryPolicy()
        self.counters = Counters()
        self._rate: NodeRate | None = None

    def location(self) -> str:
        """The store and bucket in full: what the node's write rate is kept for."""
        return self.url("")

    @property
    def rate(self) -> NodeRate:
        """The node's write rate for this store and bucket (:mod:`shardkit.io.rate`): one
        per node in the temp dir, shared by every writer process; unpaced until the store
        first throttles, then cut and raised as reads' is."""
        if self._rate is None:
            name = hashlib.sha256(self.location().encode()).hexdigest()[:24]
            root = os.path.join(tempfile.gettempdir(), f"shardkit-{os.getuid()}", "write-rates")
            self._rate = NodeRate(os.path.join(root, name), counters=self.counters)
        return self._rate

    def again(self, key: str, call: Callable[[], T]) -> T:
        """``call()``, one write request for ``key``, retried as the class says."""

        def once() -> T:
            try:
                return call()
            except Exception as exc:
                mapped = self.retryable(exc)
                if mapped is None:
                    raise
                raise mapped from exc

        return retried(
            self.url(key), once, policy=self.retry, counters=self.counters, gate=self.rate.gate
        )

    def retryable(self, exc: Exception) -> Retryable | None:
        """The SDK's error as :class:`Retryable` when another try may succeed; else None."""
        del exc
        return None

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> str:
        """Write a small object whole; its ETag."""
        up = self.upload(key)
        up.write(data)
        return up.complete()

    def upload(self, key: str) -> Upload:
        raise NotImplementedError

    def create(self, key: str, data: bytes) -> bool:
        """Write a small object only where ``key`` is not there (a conditional put: S3
        ``If-None-Match: *``, GCS generation 0, Azure no overwrite); False if it was."""
        raise NotImplementedError

    def get(self, key: str) -> bytes | None:
        """The whole (small) object, or None if there is none."""
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is not there)."""
        raise NotImplementedError

    def abort_stale(self, prefix: str, older_than: float = STALE_UPLOAD_AGE) -> int:
        """Abort unfinished uploads under ``prefix`` started more than ``older_than``
        seconds ago; how many. Only S3 keeps (and bills) them."""
        del prefix, older_than
        return 0
