"""Writing objects to GCS (:class:`GsStore`): resumable uploads driven chunk by chunk. An
unfinished resumable session holds no object and expires after a week."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from shardkit.errors import FetchError
from shardkit.io.retry import Retryable, parse_retry_after
from shardkit.io.store_base import RETRY_STATUS, ObjectInfo, ObjectStore, Upload

__all__ = ["GsStore"]

_GS_TIMEOUT = (30.0, 120.0)  # connect, read: seconds per request of a GCS upload


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
        if resp.status_code in RETRY_STATUS:
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

        if isinstance(exc, gexc.GoogleAPICallError) and exc.code in RETRY_STATUS:
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
