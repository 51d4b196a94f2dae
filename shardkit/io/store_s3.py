"""Writing objects to S3 (:class:`S3Store`): multipart uploads through boto3. An unfinished
multipart upload is billed until aborted: :meth:`S3Store.abort_stale` aborts those under a
prefix older than a grace time (a writer calls it on start)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from shardkit.errors import ConfigError
from shardkit.io.retry import Retryable
from shardkit.io.s3 import s3_retryable
from shardkit.io.store_base import STALE_UPLOAD_AGE, ObjectInfo, ObjectStore, Upload

__all__ = ["S3Store"]


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
