"""Ranged reads of ``gs://`` and ``az://`` objects through the vendors' SDKs.

``gs://bucket/key`` goes through ``google-cloud-storage`` (credentials from Google's usual
chain; ``STORAGE_EMULATOR_HOST`` points it at an emulator), ``az://container/key`` through
``azure-storage-blob`` (``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT_URL``
with ``AZURE_STORAGE_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``). The SDKs' own retries are off:
every try goes through the same retry, backoff and resume-from-the-last-byte loop as HTTP
and S3 (:mod:`shardkit.io.clocked`), so it is counted once. One client per process, made
lazily (again after fork); the environment is read when the client is made.

The two stores differ only in how one ranged GET is made and how their errors sort into
retryable and final; :class:`BlobFetcher` holds the rest once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from shardkit.counters import Counters
from shardkit.errors import ConfigError, FetchError
from shardkit.io.clocked import resuming_chunks
from shardkit.io.config import IoConfig
from shardkit.io.http import CHUNK, policy_of
from shardkit.io.retry import Gate, Retryable
from shardkit.per_process import PerProcess
from shardkit.urls import parse_url

__all__ = [
    "AzFetcher",
    "BlobFetcher",
    "GsFetcher",
    "az_client",
    "az_error",
    "gs_client",
]

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _split(url: str) -> tuple[str, str, str]:
    """``gs://bucket/a/b.tar`` -> ``("gs", "bucket", "a/b.tar")`` (``az://container/...``),
    as :func:`parse_url` splits it."""
    where = parse_url(url, need_key=True)
    if where.scheme not in ("gs", "az"):
        raise ConfigError(f"not a gs:// or az:// url: {where}")
    return where.scheme, where.bucket, where.key


class _Body:
    """One ranged GET's chunks, counted, with the object's total size."""

    def __init__(self, chunks: Iterator[bytes], total: int | None, counters: Counters) -> None:
        self.total = total
        self._chunks = chunks
        self._counters = counters

    def chunks(self) -> Iterator[bytes]:
        for data in self._chunks:
            self._counters.add("bytes_fetched", len(data))
            yield data

    def close(self) -> None:
        pass  # nothing is held here: the node's gate is the retry loop's


def _slices(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for i in range(0, len(view), CHUNK):
        yield bytes(view[i : i + CHUNK])


class BlobFetcher:
    """What a ranged fetcher of one object store needs beside its SDK: the retry loop, the
    per-node request gate, the range size, whole-object gets (see the module docstring)."""

    scheme = ""

    def __init__(self, cfg: IoConfig, counters: Counters) -> None:
        self.cfg = cfg
        self.counters = counters
        self._client: PerProcess[Any] = PerProcess(self._make_client)

    @property
    def client(self) -> Any:
        """This process's SDK client."""
        return self._client.get()

    def _make_client(self) -> Any:
        raise NotImplementedError

    def endpoint(self) -> str:
        """The service this process's client talks to (an emulator's address included)."""
        raise NotImplementedError

    def location(self, url: str) -> str:
        """Where ``url`` lives, in full: the scheme, the service endpoint this process's
        client talks to, the bucket (container) and the key; the same url on another
        service (an emulator, another account) is another location."""
        scheme, bucket, key = _split(url)
        return f"{scheme}://{bucket}/{key} @ {self.endpoint()}"

    def _get(self, bucket: str, key: str, start: int, stop: int | None) -> tuple[Any, int | None]:
        """One GET of ``[start, stop)`` (stop None: to the end): its chunks and the total."""
        raise NotImplementedError

    def _sort(self, url: str, exc: Exception) -> Exception | None:
        """The SDK's error as Retryable or FetchError; None: not the SDK's (a bug: raise)."""
        raise NotImplementedError

    def _call(self, url: str, bucket: str, key: str, start: int, stop: int | None) -> _Body:
        self.counters.add("requests")
        try:
            chunks, total = self._get(bucket, key, start, stop)
        except Exception as exc:
            mapped = self._sort(url, exc)
            if mapped is None:
                raise
            if isinstance(mapped, _PastEnd):
                return _Body(iter(()), start, self.counters)
            raise mapped from exc
        return _Body(self._guard(url, chunks), total, self.counters)

    def _guard(self, url: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from chunks
        except Exception as exc:
            mapped = self._sort(url, exc)
            if mapped is None:
                raise
            raise Retryable(f"connection broken mid-body: {exc}") from exc

    def stream(
        self, url: str, start: int = 0, end: int | None = None, *, gate: Gate | None = None
    ) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``url`` (``end`` None: to its end)."""
        _, bucket, key = _split(url)

        def open_range(pos: int, stop: int | None) -> _Body:
            last = pos + self.cfg.range_size
            return self._call(url, bucket, key, pos, last if stop is None else min(stop, last))

        return resuming_chunks(
            url,
            open_range,
            start,
            end,
            policy=policy_of(self.cfg),
            counters=self.counters,
            gate=gate,
        )

    def get(self, url: str, *, etag: str | None = None) -> tuple[bytes | None, str | None]:
        """The whole (small) object; no conditional gets here (``etag`` is ignored)."""
        del etag
        _, bucket, key = _split(url)
        data = b"".join(
            resuming_chunks(
                url,
                lambda pos, stop: self._call(url, bucket, key, pos, stop),
                0,
                None,
                policy=policy_of(self.cfg),
                counters=self.counters,
            )
        )
        return data, None


class _PastEnd(Exception):
    """A range that starts at or past the end of the object: nothing there, as with a file."""


def _status_error(url: str, status: int | None, what: str) -> Exception:
    if status == 416:
        return _PastEnd()
    if status is None or status in _RETRY_STATUS:
        return Retryable(what, status=status)
    return FetchError(what, url=url, status=status)


def az_error(url: str, code: object, text: str = "") -> str:
    """An Azure error (its ``error_code`` or status, the SDK's text) in one line, naming
    what is missing: the SDK's text is a multi-line dump of the response's XML."""
    if code == "ContainerNotFound":
        container = parse_url(url).bucket
        return f"the Azure container {container!r} does not exist: create it, or fix the url"
    lines = text.strip().splitlines()
    return f"Azure {code}: {lines[0] if lines else 'no message'}"


def gs_client() -> Any:
    """A ``google.cloud.storage.Client``: anonymous against ``STORAGE_EMULATOR_HOST``."""
    try:
        from google.cloud import storage
    except ImportError as exc:
        raise ConfigError(
            "gs:// urls need google-cloud-storage: pip install 'shardkit[gcs]'"
        ) from exc
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
        return storage.Client(project="shardkit", credentials=anonymous)
    return storage.Client()


class GsFetcher(BlobFetcher):
    """Ranged reads of ``gs://bucket/key`` (see the module docstring)."""

    scheme = "gs"

    def _make_client(self) -> Any:
        return gs_client()

    def endpoint(self) -> str:
        return f"{self.client.api_endpoint} project={self.client.project}"

    def _get(self, bucket: str, key: str, start: int, stop: int | None) -> tuple[Any, int | None]:
        blob = self.client.bucket(bucket).blob(key)
        if stop is None:  # the size is needed to know where the object ends
            meta = self.client.bucket(bucket).get_blob(key, retry=None)
            if meta is None:
                raise FetchError("GCS object not found", url=f"gs://{bucket}/{key}", status=404)
            total = int(meta.size)
            stop = total
            if start >= total:
                return iter(()), total
        else:
            total = None
        data = blob.download_as_bytes(
            start=start, end=stop - 1, raw_download=True, checksum=None, retry=None
        )
        if total is None and len(data) < stop - start:
            total = start + len(data)  # a whole answer shorter than asked: the object ends
        return _slices(data), total

    def _sort(self, url: str, exc: Exception) -> Exception | None:
        import requests
        from google.api_core import exceptions as gexc

        if isinstance(exc, FetchError):
            return exc
        if isinstance(exc, gexc.GoogleAPICallError):
            return _status_error(url, exc.code, f"GCS {type(exc).__name__}: {exc}")
        if isinstance(exc, (requests.RequestException, OSError)):
            return Retryable(f"GCS connection failed: {exc}")
        return None


def az_client() -> Any:
    """An ``azure.storage.blob.BlobServiceClient`` from the environment (module docstring)."""
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError as exc:
        raise ConfigError(
            "az:// urls need azure-storage-blob: pip install 'shardkit[azure]'"
        ) from exc
    conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        return BlobServiceClient.from_connection_string(conn, retry_total=0)
    url = os.environ.get("AZURE_STORAGE_ACCOUNT_URL")
    if not url and os.environ.get("AZURE_STORAGE_ACCOUNT"):
        url = f"https://{os.environ['AZURE_STORAGE_ACCOUNT']}.blob.core.windows.net"
    if not url:
        raise ConfigError(
            "az:// urls need AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_URL "
            "(or AZURE_STORAGE_ACCOUNT) with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN"
        )
    cred = os.environ.get("AZURE_STORAGE_KEY") or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    return BlobServiceClient(url, credential=cred, retry_total=0)


class AzFetcher(BlobFetcher):
    """Ranged reads of ``az://container/key`` (see the module docstring)."""

    scheme = "az"

    def _make_client(self) -> Any:
        return az_client()

    def endpoint(self) -> str:
        return str(self.client.url)

    def _get(self, bucket: str, key: str, start: int, stop: int | None) -> tuple[Any, int | None]:
        length = None if stop is None else stop - start
        down = self.client.get_container_client(bucket).download_blob(
            key, offset=start, length=length, max_concurrency=1
        )
        return down.chunks(), int(down.properties.size)

    def _sort(self, url: str, exc: Exception) -> Exception | None:
        from azure.core import exceptions as aexc

        if isinstance(exc, aexc.HttpResponseError):
            code = getattr(exc, "error_code", None) or exc.status_code
            text = str(exc.reason or exc)
            return _status_error(url, exc.status_code, az_error(url, code, text))
        if isinstance(exc, (aexc.ServiceRequestError, aexc.ServiceResponseError, OSError)):
            return Retryable(f"Azure connection failed: {exc}")
        return None
