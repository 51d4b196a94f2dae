"""Writing objects to object stores (``s3://``, ``gs://``, ``az://``): what a writer needs.

An :class:`ObjectStore` puts small objects whole (indexes, manifests, journal entries) and
streams big ones up as they are written (:meth:`ObjectStore.upload`): S3 multipart uploads,
GCS resumable uploads, Azure block blobs. An upload keeps at most one part in memory
(``part_size``, 8 MiB by default), never a whole shard, and the object appears only when
:meth:`Upload.complete` is called: a writer that dies leaves no partial object. What a
dead writer leaves behind is named by the store:

- S3: an unfinished multipart upload is billed until aborted; :meth:`abort_stale` aborts
  those under a prefix older than a grace time (a writer calls it on start), and a bucket
  lifecycle rule (``AbortIncompleteMultipartUpload``) is the belt to these braces;
- GCS: an unfinished resumable session holds no object and expires after a week;
- Azure: uncommitted blocks are dropped by the service after a week.

The interface is in :mod:`shardkit.io.store_base` (re-exported here). Clients come from
the same places the readers' do (:mod:`shardkit.io.s3`,
:mod:`shardkit.io.blobs`). Every write request is retried by shardkit's own loop, under
the policy and deadline of reads (:meth:`ObjectStore.again`): an S3 part is sent again
whole under its number, a GCS chunk from where the session says the store has the bytes
to, an Azure block again under its id; a commit (S3's complete, Azure's block list) is
idempotent, and a complete whose first answer was lost finds the object made. The object
appears only at its commit, so a write that fails after its retries leaves none.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import re
from collections.abc import Iterator
from typing import Any

from shardkit.errors import ConfigError, FetchError
from shardkit.io.retry import Retryable, parse_retry_after
from shardkit.io.s3 import s3_retryable
from shardkit.io.store_base import (
    DEFAULT_PART_SIZE,
    STALE_UPLOAD_AGE,
    ObjectInfo,
    ObjectStore,
    Upload,
    is_object_url,
)
from shardkit.urls import OBJECT_SCHEMES, parse_url

__all__ = ["ObjectInfo", "ObjectStore", "Upload", "is_object_url", "open_store"]

_GS_TIMEOUT = (30.0, 120.0)  # connect, read: seconds per request of a GCS upload
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def open_store(
    url: str, *, endpoint_url: str | None = None, part_size: int | None = None
) -> tuple[ObjectStore, str]:
    """The store of an object-store url and the key prefix inside it (no leading ``/``),
    as :func:`shardkit.urls.parse_url` splits it (a url it refuses is a ConfigError)."""
    where = parse_url(url)
    if where.scheme not in OBJECT_SCHEMES:
        raise ConfigError(f"not an s3://, gs:// or az:// url: {where}")
    size = part_size or DEFAULT_PART_SIZE
    store: ObjectStore
    if where.scheme == "s3":
        store = S3Store(where.bucket, endpoint_url=endpoint_url, part_size=size)
    elif where.scheme == "gs":
        store = GsStore(where.bucket, part_size=size)
    else:
        store = AzStore(where.bucket, part_size=size)
    return store, where.key


# -- S3 ----------------------------------------------------------------------------------
class _S3Upload(Upload):
    def __init__(self, store: S3Store, key: str) -> None:
        super().__init__(store.part_size)
        self._s, self._c = store, store.writer
        self._b, self._k = store.bucket, key
        made = store.again(key, lambda: self._c.create_multipart_upload(Bucket=self._b, Key=key))
        self._id = made["UploadId"]
        self._parts: list[dict[str, Any]] = []

    def _send(self, part: bytes) -> None:
        n = len(self._parts) + 1
        out = self._s.again(
            self._k,
            lambda: self._c.upload_part(
                Bucket=self._b, Key=self._k, UploadId=self._id, PartNumber=n, Body=part
            ),
        )
        self._parts.append({"PartNumber": n, "ETag": out["ETag"]})

    def _finish(self, last: bytes) -> str:
        if last or not self._parts:
            self._send(last)
        tries = [0]
        return self._s.again(self._k, lambda: self._complete(tries))

    def _complete(self, tries: list[int]) -> str:
        """One complete; a retried one told the upload is gone finds the object its
        lost first answer made (the size of every part sent), else raises."""
        from botocore.exceptions import ClientError

        tries[0] += 1
        try:
            out = self._c.complete_multipart_upload(
                Bucket=self._b,
                Key=self._k,
                UploadId=self._id,
                MultipartUpload={"Parts": self._parts},
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            info = self._s.head(self._k) if tries[0] > 1 and code == "NoSuchUpload" else None
            if info is None or info.size != self.size:
                raise
            return info.etag
        return str(out.get("ETag", ""))

    def _drop(self) -> None:
        self._s.again(
            self._k,
            lambda: self._c.abort_multipart_upload(Bucket=self._b, Key=self._k, UploadId=self._id),
        )


class S3Store(ObjectStore):
    """An S3 bucket through boto3 (endpoint from ``endpoint_url`` or ``AWS_ENDPOINT_URL``)."""

    scheme = "s3"

    def __init__(self, bucket: str, *, endpoint_url: str | None = None, part_size: int) -> None:
        super().__init__(bucket, part_size=max(part_size, 5 << 20))
        try:
            import boto3
        except ImportError as exc:
            raise ConfigError("s3:// targets need boto3: pip install 'shardkit[s3]'") from exc
        from botocore.config import Config

        session = boto3.session.Session()
        self.client = session.client("s3", endpoint_url=endpoint_url)
        # writes: every try through shardkit's loop (again), each counted once
        once = Config(retries={"total_max_attempts": 1})
        self.writer = session.client("s3", endpoint_url=endpoint_url, config=once)

    def retryable(self, exc: Exception) -> Retryable | None:
        return s3_retryable(exc)

    def location(self) -> str:
        return f"{self.writer.meta.endpoint_url} {self.url('')}"

    def upload(self, key: str) -> Upload:
        return _S3Upload(self, key)

    def put(self, key: str, data: bytes) -> str:
        w = self.writer
        out = self.again(key, lambda: w.put_object(Bucket=self.bucket, Key=key, Body=data))
        return str(out.get("ETag", ""))

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:  # 409: another conditional put of it is under way
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def get(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            out = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        return ObjectInfo(key, int(out["ContentLength"]), str(out.get("ETag", "")))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            for o in page.get("Contents", []):
                yield ObjectInfo(o["Key"], int(o["Size"]), str(o.get("ETag", "")))

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def abort_stale(self, prefix: str, older_than: float = STALE_UPLOAD_AGE) -> int:
        now = datetime.datetime.now(datetime.timezone.utc)
        n = 0
        out = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        for up in out.get("Uploads", []):
            if (now - up["Initiated"]).total_seconds() >= older_than:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                )
                n += 1
        return n


# -- GCS ---------------------------------------------------------------------------------
class _GsUpload(Upload):
    """A GCS resumable session driven chunk by chunk (a PUT per part with its
    ``Content-Range``). Not the SDK's ``BlobWriter``: that is an ``io`` object whose
    finalizer closes it, so a writer dropped without ``complete`` (a crash caught, a test
    that lets it go) made the partial shard appear when the garbage collector ran, and its
    requests ran at whatever point the collector did (a single-threaded server then waited
    on one half of an interrupted request: CI hung there)."""

    def __init__(self, store: GsStore, key: str) -> None:
        # parts are multiples of 256 KiB, as the resumable protocol asks
        super().__init__(max(256 << 10, store.part_size // (256 << 10) * (256 << 10)))
        blob = store.client.bucket(store.bucket).blob(key)
        self._session: str = blob.create_resumable_upload_session()
        self._http = store.client._http  # the client's authorised requests session
        self._sent = 0
        self._store, self._key = store, key

    def _put(self, data: bytes, *, last: bool) -> Any:
        """Send ``data`` (the next chunk), retried: after a failed try the session is asked
        how far the store has the bytes, and the rest of the chunk goes from there."""
        lo, hi = self._sent, self._sent + len(data)
        total = str(hi) if last else "*"
        tries = [0]

        def once() -> Any:
            at = lo
            if tries[0]:
                resp = self._ask(f"bytes */{total}")
                if resp.status_code in (200, 201):
                    return resp  # the last chunk's first answer was lost: the object is made
                at = self._persisted(resp, lo)
            tries[0] += 1
            if at == hi and not last:
                return None  # the store has the whole chunk
            span = f"bytes {at}-{hi - 1}/{total}" if at < hi else f"bytes */{total}"
            return self._ask(span, data[at - lo :], want=(200, 201) if last else (308,))

        resp = self._store.again(self._key, once)
        self._sent = hi
        return resp

    def _ask(self, span: str, data: bytes = b"", want: tuple[int, ...] = (200, 201, 308)) -> Any:
        """One PUT to the session; a status worth another try as Retryable."""
        import requests

        try:
            resp = self._http.put(
                self._session, data=data, headers={"Content-Range": span}, timeout=_GS_TIMEOUT
            )
        except requests.RequestException as exc:
            raise Retryable(f"GCS connection failed: {exc}") from exc
        if resp.status_code in want:
            return resp
        if resp.status_code in _RETRY_STATUS:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            raise Retryable(f"GCS HTTP {resp.status_code} to {span}", status=resp.status_code,
                            retry_after=retry_after)  # fmt: skip
        raise FetchError(
            f"{self._store.url(self._key)}: the resumable upload answered HTTP "
            f"{resp.status_code} to {span} (wanted {want}): {resp.text[:200]}"
        )

    @staticmethod
    def _persisted(resp: Any, lo: int) -> int:
        """Where the store's copy ends, from a status answer's ``Range: bytes=0-N`` (none:
        no bytes; the GCS emulator spells that ``bytes=0-0``, GCS never persists 1 byte)."""
        m = re.match(r"bytes=0-(\d+)$", resp.headers.get("Range", ""))
        return max(lo, int(m.group(1)) + 1) if m and m.group(1) != "0" else lo

    def _send(self, part: bytes) -> None:
        self._put(part, last=False)

    def _finish(self, last: bytes) -> str:
        resp = self._put(last, last=True)
        with contextlib.suppress(ValueError):
            etag = resp.json().get("etag")
            if etag:
                return str(etag)
        info = self._store.head(self._key)
        return info.etag if info else ""

    def _drop(self) -> None:
        # cancel the session (best effort: an unfinished session holds no object)
        with contextlib.suppress(Exception):
            self._http.delete(self._session, timeout=_GS_TIMEOUT)


class GsStore(ObjectStore):
    """A GCS bucket through google-cloud-storage (``STORAGE_EMULATOR_HOST`` honoured)."""

    scheme = "gs"

    def __init__(self, bucket: str, *, part_size: int) -> None:
        super().__init__(bucket, part_size=part_size)
        from shardkit.io.blobs import gs_client

        self.client = gs_client()

    def upload(self, key: str) -> Upload:
        return _GsUpload(self, key)

    def retryable(self, exc: Exception) -> Retryable | None:
        import requests
        from google.api_core import exceptions as gexc

        if isinstance(exc, gexc.GoogleAPICallError) and exc.code in _RETRY_STATUS:
            return Retryable(f"GCS {type(exc).__name__}: {exc}", status=exc.code)
        if isinstance(exc, requests.RequestException):
            return Retryable(f"GCS connection failed: {exc}")
        return None

    def put(self, key: str, data: bytes) -> str:
        blob = self.client.bucket(self.bucket).blob(key)
        self.again(key, lambda: blob.upload_from_string(data, retry=None))
        return str(blob.etag or "")

    def create(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self.client.bucket(self.bucket).blob(key).upload_from_string(
                data, if_generation_match=0
            )
        except PreconditionFailed:
            return False
        return True

    def get(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self.client.bucket(self.bucket).blob(key).download_as_bytes())
        except NotFound:
            return None

    def head(self, key: str) -> ObjectInfo | None:
        blob = self.client.bucket(self.bucket).get_blob(key)
        return None if blob is None else ObjectInfo(key, int(blob.size), str(blob.etag))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for blob in self.client.list_blobs(self.bucket, prefix=prefix):
            yield ObjectInfo(blob.name, int(blob.size), str(blob.etag))

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self.client.bucket(self.bucket).blob(key).delete()


# -- Azure -------------------------------------------------------------------------------
class _AzUpload(Upload):
    def __init__(self, store: AzStore, key: str) -> None:
        super().__init__(store.part_size)
        self._blob = store.container.get_blob_client(key)
        self._ids: list[str] = []
        self._store, self._key = store, key

    def _send(self, part: bytes) -> None:
        block = base64.b64encode(f"{len(self._ids):010d}".encode()).decode()
        self._store.again(self._key, lambda: self._blob.stage_block(block, part))
        self._ids.append(block)

    def _finish(self, last: bytes) -> str:
        from azure.storage.blob import BlobBlock

        if last or not self._ids:
            self._send(last)
        blocks = [BlobBlock(block_id=b) for b in self._ids]
        out = self._store.again(self._key, lambda: self._blob.commit_block_list(blocks))
        return str(out.get("etag", ""))

    def _drop(self) -> None:
        pass  # uncommitted blocks are dropped by the service


class AzStore(ObjectStore):
    """An Azure Blob container through azure-storage-blob (:func:`shardkit.io.blobs.az_client`)."""

    scheme = "az"

    def __init__(self, bucket: str, *, part_size: int) -> None:
        super().__init__(bucket, part_size=part_size)
        from azure.core.exceptions import HttpResponseError

        from shardkit.io.blobs import az_client, az_error

        self.container = az_client().get_container_client(bucket)
        try:
            found = self.container.exists()
        except HttpResponseError as exc:  # no right to ask: the writes will say what they can
            found = exc.status_code != 404
        if not found:
            url = self.url("")
            raise FetchError(az_error(url, "ContainerNotFound"), url=url, status=404)

    def upload(self, key: str) -> Upload:
        return _AzUpload(self, key)

    def retryable(self, exc: Exception) -> Retryable | None:
        from azure.core import exceptions as aexc

        if isinstance(exc, aexc.HttpResponseError) and exc.status_code in _RETRY_STATUS:
            return Retryable(f"Azure {exc.status_code}: {exc.reason}", status=exc.status_code)
        if isinstance(exc, (aexc.ServiceRequestError, aexc.ServiceResponseError)):
            return Retryable(f"Azure connection failed: {exc}")
        return None

    def put(self, key: str, data: bytes) -> str:
        blob = self.container.get_blob_client(key)
        out = self.again(key, lambda: blob.upload_blob(data, overwrite=True))
        return str(out.get("etag", ""))

    def create(self, key: str, data: bytes) -> bool:
        from azure.core.exceptions import ResourceExistsError

        try:
            self.container.get_blob_client(key).upload_blob(data, overwrite=False)
        except ResourceExistsError:
            return False
        return True

    def get(self, key: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self.container.download_blob(key).readall())
        except ResourceNotFoundError:
            return None

    def head(self, key: str) -> ObjectInfo | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            p = self.container.get_blob_client(key).get_blob_properties()
        except ResourceNotFoundError:
            return None
        return ObjectInfo(key, int(p.size), str(p.etag))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for b in self.container.list_blobs(name_starts_with=prefix):
            yield ObjectInfo(b.name, int(b.size), str(b.etag))

    def delete(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        with contextlib.suppress(ResourceNotFoundError):
            self.container.delete_blob(key)
