"""``s3://bucket/key`` through boto3, for AWS and S3-compatible stores.

The endpoint comes from ``endpoint_url=`` (or boto3's own ``AWS_ENDPOINT_URL``);
credentials and region from boto3's usual chain. Reads are ranged ``GetObject`` calls with
the same retry, backoff and resume-from-the-last-byte loop as HTTP
(:mod:`shardkit.io.clocked`); botocore's own retries are turned off so that every try is
counted once. One client per process (:class:`~shardkit.per_process.PerProcess`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from shardkit.counters import Counters
from shardkit.errors import ConfigError, FetchError
from shardkit.io.clocked import resuming_chunks
from shardkit.io.config import IoConfig
from shardkit.io.http import CHUNK, policy_of
from shardkit.io.retry import Gate, Retryable, parse_retry_after
from shardkit.urls import parse_url

__all__ = ["S3Fetcher", "s3_retryable"]
from shardkit.per_process import PerProcess

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)


def s3_retryable(exc: Exception) -> Retryable | None:
    """A boto3 error worth another try (429, 5xx, ``SlowDown`` and its kin, no answer or
    a dropped connection) as :class:`Retryable`; None for any other."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _RETRY_CODES or status in (429, 500, 502, 503, 504):
            retry_after = parse_retry_after(meta.get("HTTPHeaders", {}).get("retry-after"))
            return Retryable(f"S3 {code}", status=status, retry_after=retry_after)
        return None
    if isinstance(exc, BotoCoreError):
        return Retryable(f"S3 connection failed: {exc}")
    return None


def _split(url: str) -> tuple[str, str]:
    """The bucket and key of an ``s3://`` url naming an object (:func:`parse_url`)."""
    where = parse_url(url, need_key=True)
    if where.scheme != "s3":
        raise ConfigError(f"not an s3:// url: {where}")
    return where.bucket, where.key


class _S3Body:
    """The streaming body of one ``GetObject``: ``want`` is the bytes its answer promised
    (None: unknown); one that ends before them is a dropped connection (:class:`Retryable`),
    never a whole answer, as the bytes read here bypass botocore's own length check."""

    def __init__(self, body: Any, want: int | None, total: int | None, counters: Counters):
        self.total = total
        self._body = body
        self._want = want
        self._counters = counters

    def chunks(self) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError

        try:
            while self._want is None or self._want > 0:
                n = CHUNK if self._want is None else min(CHUNK, self._want)
                data = self._read(n)
                if not data:
                    if self._want:
                        raise Retryable(f"connection ended {self._want} bytes short of the answer")
                    return
                if self._want is not None:
                    self._want -= len(data)
                self._counters.add("bytes_fetched", len(data))
                yield data
        except (BotoCoreError, OSError) as exc:
            raise Retryable(f"connection broken mid-body: {exc}") from exc

    def _read(self, n: int) -> bytes:
        """What has arrived, up to ``n`` bytes: botocore's ``read(n)`` waits for all ``n``,
        so a trickle would never reach the minimum-rate check between chunks."""
        raw = getattr(self._body, "_raw_stream", None)  # urllib3's response under botocore
        read1 = getattr(raw, "read1", None)
        data: bytes = read1(n) if read1 is not None else self._body.read(n)
        return data

    def close(self) -> None:
        self._body.close()


class S3Fetcher:
    """Ranged reads of ``s3://`` urls.

    Args:
        cfg: endpoint, timeouts, range size and retry policy.
        counters: where requests, bytes and retries are counted.
    """

    def __init__(self, cfg: IoConfig, counters: Counters) -> None:
        self.cfg = cfg
        self.counters = counters
        # this process's client and the profile it was made with
        self._client: PerProcess[tuple[Any, str | None]] = PerProcess(self._make_client)

    @property
    def client(self) -> Any:
        """This process's boto3 S3 client."""
        return self._client.get()[0]

    def _make_client(self) -> tuple[Any, str | None]:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigError("s3:// urls need boto3: pip install 'shardkit[s3]'") from exc
        config = Config(
            connect_timeout=self.cfg.connect_timeout,
            read_timeout=policy_of(self.cfg).read_timeout(self.cfg.read_timeout),
            retries={"total_max_attempts": 1},
            max_pool_connections=max(10, self.cfg.cache.prefetch_threads + 2),
        )
        session = boto3.session.Session()
        client = session.client("s3", endpoint_url=self.cfg.endpoint_url, config=config)
        return client, session.profile_name

    def location(self, url: str) -> str:
        """Where ``url`` lives, in full: the endpoint this process's client talks to (from
        ``endpoint_url``, ``AWS_ENDPOINT_URL`` or the profile's config), its region and
        profile, the bucket and the key. The same ``s3://`` url on another store is
        another location, so nothing derived from one is taken for the other."""
        bucket, key = _split(url)
        client, profile = self._client.get()
        meta = client.meta
        profile = profile or "default"
        return f"s3://{bucket}/{key} @ {meta.endpoint_url} region={meta.region_name} {profile=}"

    def stream(
        self, url: str, start: int = 0, end: int | None = None, *, gate: Gate | None = None
    ) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``url`` (``end`` None: to its end)."""
        bucket, key = _split(url)
        return resuming_chunks(
            url,
            lambda pos, stop: self._open_range(url, bucket, key, pos, stop),
            start,
            end,
            policy=policy_of(self.cfg),
            counters=self.counters,
            gate=gate,
        )

    def _call(self, url: str, **kwargs: Any) -> dict[str, Any]:
        """One ``GetObject``, its errors sorted into retryable and final."""
        from botocore.exceptions import BotoCoreError, ClientError

        self.counters.add("requests")
        try:
            out: dict[str, Any] = self.client.get_object(**kwargs)
            return out
        except (ClientError, BotoCoreError) as exc:
            again = s3_retryable(exc)
            if again is not None:
                raise again from exc
            assert isinstance(exc, ClientError)  # every BotoCoreError is retryable
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "")
            if status == 304 or code in ("304", "NotModified"):
                return {"NotModified": True}
            if code == "InvalidRange":
                return {"InvalidRange": True}
            raise FetchError(f"S3 {code}: {exc}", url=url, status=status) from exc

    def _open_range(self, url: str, bucket: str, key: str, pos: int, end: int | None) -> _S3Body:
        stop = pos + self.cfg.range_size if end is None else min(end, pos + self.cfg.range_size)
        out = self._call(url, Bucket=bucket, Key=key, Range=f"bytes={pos}-{stop - 1}")
        if out.get("InvalidRange"):  # asked past the end: nothing there, as with a file
            return _S3Body(_Empty(), 0, pos, self.counters)
        m = _CONTENT_RANGE.match(out.get("ContentRange") or "")
        total = int(m.group(3)) if m and m.group(3) != "*" else None
        length = out.get("ContentLength")  # the range's bytes: fewer at the object's end
        want = stop - pos if length is None else min(stop - pos, length)
        return _S3Body(out["Body"], want, total, self.counters)

    def get(self, url: str, *, etag: str | None = None) -> tuple[bytes | None, str | None]:
        """The whole object and its ETag; ``(None, etag)`` if it still has ``etag``."""
        bucket, key = _split(url)
        extra = {"IfNoneMatch": etag} if etag else {}
        seen: dict[str, Any] = {}

        def whole(pos: int, end: int | None) -> _S3Body:
            out = self._call(url, Bucket=bucket, Key=key, **extra)
            if out.get("NotModified"):
                seen["not_modified"] = True
                return _S3Body(_Empty(), 0, 0, self.counters)
            seen["etag"] = out.get("ETag")
            _discard(out["Body"], pos)  # a retry after a partial read: skip what was delivered
            total = out.get("ContentLength")
            want = None if total is None else total - pos
            return _S3Body(out["Body"], want, total, self.counters)

        data = b"".join(
            resuming_chunks(url, whole, 0, None, policy=policy_of(self.cfg), counters=self.counters)
        )
        if seen.get("not_modified"):
            return None, etag
        return data, seen.get("etag")


class _Empty:
    def read(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        pass


def _discard(body: Any, n: int) -> None:
    while n > 0:
        got = body.read(min(n, CHUNK))
        if not got:
            return
        n -= len(got)
