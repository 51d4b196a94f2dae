"""HTTP(S): ranged GETs over one keep-alive ``requests.Session`` per process.

Each read of ``[start, end)`` is a run of ``Range`` requests of ``range_size`` bytes. A
dropped connection, a stall past ``read_timeout``, a body below the minimum rate, a 429/5xx
are retried (backoff with jitter, ``Retry-After`` honoured within the deadline) and the read
resumes at the first byte not yet delivered (:mod:`shardkit.io.clocked`). A server that
ignores ``Range`` (200 instead of 206) still works: the bytes before the wanted offset are
skipped.

The session is a :class:`~shardkit.per_process.PerProcess` resource: made lazily, again in
a forked child, never pickled, so an opener can be pickled into DataLoader workers and
never shares a socket across processes.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator

import requests
import urllib3

from shardkit.counters import Counters
from shardkit.errors import FetchError
from shardkit.io.clocked import resuming_chunks
from shardkit.io.config import IoConfig
from shardkit.io.retry import Gate, Retryable, RetryPolicy, parse_retry_after
from shardkit.per_process import PerProcess
from shardkit.urls import parse_url

__all__ = ["CHUNK", "HttpFetcher", "policy_of"]

CHUNK = 1 << 20
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIABLE = re.compile(r"bytes\s+\*/(\d+)")


def policy_of(cfg: IoConfig) -> RetryPolicy:
    """The retry policy an :class:`IoConfig` describes."""
    return cfg.retry


class _Body:
    """The body of one ranged GET, bounded to the bytes asked for."""

    def __init__(
        self,
        resp: requests.Response,
        skip: int,
        want: int | None,
        total: int | None,
        counters: Counters | None = None,
    ) -> None:
        self.total = total
        self._resp = resp
        self._skip = skip
        self._want = want
        self._counters = counters

    def chunks(self) -> Iterator[bytes]:
        raw = self._resp.raw
        try:
            while self._skip:
                got = raw.read(min(self._skip, CHUNK))
                if not got:
                    raise Retryable("connection ended before the wanted offset")
                self._skip -= len(got)
            while self._want is None or self._want > 0:
                # read1: what has arrived, so a stall or a drop loses no received bytes
                data = raw.read1(CHUNK if self._want is None else min(CHUNK, self._want))
                if not data:
                    return
                if self._want is not None:
                    self._want -= len(data)
                if self._counters is not None:
                    self._counters.add("bytes_fetched", len(data))
                yield data
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            raise Retryable(f"connection broken mid-body: {exc}") from exc

    def close(self) -> None:
        self._resp.close()


class HttpFetcher:
    """Ranged reads of ``http(s)://`` urls with retries, resume and timeouts.

    Args:
        cfg: timeouts, range size and retry policy.
        counters: where requests, bytes and retries are counted.
    """

    def __init__(self, cfg: IoConfig, counters: Counters) -> None:
        self.cfg = cfg
        self.counters = counters
        self._session: PerProcess[requests.Session] = PerProcess(self._make_session)

    @property
    def session(self) -> requests.Session:
        """This process's keep-alive session (a new one after fork)."""
        return self._session.get()

    def _make_session(self) -> requests.Session:
        s = requests.Session()
        s.headers["Accept-Encoding"] = "identity"  # byte ranges of the stored bytes
        return s

    def location(self, url: str) -> str:
        """Where ``url`` lives, in full and in one spelling (scheme, host, port, path,
        query): what a node's copy of a manifest or its compact form is named by."""
        return parse_url(url).location()

    def stream(
        self, url: str, start: int = 0, end: int | None = None, *, gate: Gate | None = None
    ) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``url`` (``end`` None: to its end)."""
        parse_url(url, need_key=True)  # a url naming another place is refused, not read
        return resuming_chunks(
            url,
            lambda pos, stop: self._open_range(url, pos, stop),
            start,
            end,
            policy=policy_of(self.cfg),
            counters=self.counters,
            gate=gate,
        )

    def _request(self, url: str, headers: dict[str, str]) -> requests.Response:
        self.counters.add("requests")
        try:
            return self.session.get(
                url,
                headers=headers,
                stream=True,
                timeout=(
                    self.cfg.connect_timeout,
                    policy_of(self.cfg).read_timeout(self.cfg.read_timeout),
                ),
                allow_redirects=True,
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Retryable(f"cannot connect or no answer: {exc}") from exc
        except requests.RequestException as exc:
            raise FetchError(f"bad request: {exc}", url=url) from exc

    def _open_range(self, url: str, pos: int, end: int | None) -> _Body:
        stop = pos + self.cfg.range_size if end is None else min(end, pos + self.cfg.range_size)
        resp = self._request(url, {"Range": f"bytes={pos}-{stop - 1}"})
        return self._body(url, resp, pos, stop, end)

    def _body(
        self, url: str, resp: requests.Response, pos: int, stop: int, end: int | None
    ) -> _Body:
        status = resp.status_code
        if status == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            first = -1 if m is None else int(m.group(1))
            last = -1 if m is None else int(m.group(2)) + 1
            if not first <= pos < last:
                resp.close()
                raise FetchError(
                    f"bad Content-Range {resp.headers.get('Content-Range')!r} for offset {pos}",
                    url=url,
                    status=status,
                )
            total = None if m is None or m.group(3) == "*" else int(m.group(3))
            # a superset of the range asked (some servers and CDNs answer so): the bytes
            # before it are skipped and those past it never read, so the caller gets
            # exactly [pos, stop) and checks them (by their piece) as any others
            return _Body(resp, pos - first, min(last, stop) - pos, total, self.counters)
        if status == 200:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            return _Body(resp, pos, None if end is None else end - pos, total, self.counters)
        resp.close()
        if status == 416:  # asked past the end: nothing there, as with a file
            m = _UNSATISFIABLE.match(resp.headers.get("Content-Range", ""))
            return _Body(resp, 0, 0, int(m.group(1)) if m else pos)
        if status in _RETRY_STATUS:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            raise Retryable(f"HTTP {status}", status=status, retry_after=retry_after)
        raise FetchError("refused", url=url, status=status)

    def get(self, url: str, *, etag: str | None = None) -> tuple[bytes | None, str | None]:
        """The whole object and its ETag; ``(None, etag)`` if it still has ``etag`` (304)."""
        parse_url(url, need_key=True)
        seen: dict[str, str | None] = {}

        def whole(pos: int, end: int | None) -> _Body:
            resp = self._request(url, {"If-None-Match": etag} if etag else {})
            if resp.status_code == 304:
                resp.close()
                seen["status"] = "304"
                return _Body(resp, 0, 0, 0)
            if resp.status_code != 200:
                return self._body(url, resp, pos, pos, end)
            seen["etag"] = resp.headers.get("ETag")
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            return _Body(resp, pos, None, total, self.counters)

        data = b"".join(
            resuming_chunks(url, whole, 0, None, policy=policy_of(self.cfg), counters=self.counters)
        )
        if seen.get("status") == "304":
            return None, etag
        return data, seen.get("etag")
