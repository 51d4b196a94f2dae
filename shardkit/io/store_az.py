"""Writing objects to Azure Blob storage (:class:`AzStore`): block blobs, committed by their
block list. Uncommitted blocks are dropped by the service after a week."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator

from shardkit.errors import FetchError
from shardkit.io.retry import Retryable
from shardkit.io.store_base import RETRY_STATUS, ObjectInfo, ObjectStore, Upload

__all__ = ["AzStore"]


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

        if isinstance(exc, aexc.HttpResponseError) and exc.status_code in RETRY_STATUS:
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
