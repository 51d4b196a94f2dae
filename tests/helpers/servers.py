"""Real servers the tests start on 127.0.0.1: an HTTP file server with Range support, a
request log and fault injection, and moto's S3 server.

``RangeServer(root)`` serves the files under ``root`` over HTTP/1.1 keep-alive, with
``Range`` (206), ``ETag``/``If-None-Match`` (304), an optional latency per request and a
total bandwidth cap. Every request is logged (path, range, status, body bytes sent).
Faults are queued per path pattern and each hits ``times`` requests:

- ``drop``: send ``after`` bytes of the body, then cut the connection;
- ``status``: answer ``status`` (429, 503, ...) with an optional ``Retry-After``;
- ``stall``: send ``after`` bytes, go silent for ``seconds``, then go on;
- ``corrupt``: flip one bit of the file's byte at offset ``at`` in a body that holds it;
- ``trickle``: send ``after`` bytes, then ``step`` bytes every ``seconds`` to the end;
- ``long``: answer a Range with a 206 whose Content-Range and body run ``after`` bytes past
  the range asked for (the file's next bytes, each flipped unless ``honest``).

- ``wide``: answer a Range with a 206 whose Content-Range is a superset of the range
  asked (starting ``at`` bytes before it and running ``after`` bytes past it, within the
  object), with the object's bytes, as some servers and CDNs do;
- ``full``: answer a Range with 200 and the whole object;
- ``swap``: serve the bytes of ``other`` (a path of the same size) under this name.

``start``, when set, limits a fault to requests whose range starts at that offset.

``per_connection`` caps the bytes per second of each connection on its own (as object
stores cap single streams), besides the total ``bandwidth``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "Fault",
    "RangeServer",
    "Record",
    "free_port",
    "moto_process",
    "moto_server",
    "s3_bucket",
]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_PIECE = 256 << 10


@dataclass
class Record:
    """One request the server answered."""

    method: str
    path: str
    range: str | None
    status: int
    sent: int = 0
    start: float = 0.0
    end: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    client: tuple[str, int] = ("", 0)


@dataclass
class Fault:
    """A fault served to the next ``times`` requests whose path matches ``pattern``."""

    pattern: str
    kind: str  # "drop" | "status" | "stall" | "corrupt" | "trickle" | "long" | "wide" | "full"
    # | "swap"
    times: int = 1
    after: int = 0
    at: int = 0
    status: int = 503
    retry_after: str | None = None
    seconds: float = 0.0
    step: int = 20
    start: int | None = None
    honest: bool = False
    other: str | None = None


class _Throttle:
    """A total bandwidth cap shared by every connection."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + n / self.rate
            until = self._free_at
        time.sleep(max(0.0, until - time.monotonic()))


class RangeServer:
    """A threaded HTTP server for the files under ``root`` (see the module docstring).

    Args:
        root: the directory served.
        latency: seconds added before every answer.
        bandwidth: bytes per second for all bodies together (None: no cap).
        per_connection: bytes per second of each connection (None: no cap).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        per_connection: float | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.latency = latency
        self.throttle = _Throttle(bandwidth)
        self.per_connection = per_connection
        self.log: list[Record] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.body_started = threading.Condition(self.lock)
        handler = type("Handler", (_Handler,), {"srv": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def start(self) -> RangeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_fault(self, pattern: str, kind: str, **kwargs: Any) -> Fault:
        f = Fault(pattern, kind, **kwargs)
        with self.lock:
            self.faults.append(f)
        return f

    def take_fault(
        self, path: str, span: tuple[int, int] | None = None, *, lo: int | None = None
    ) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if (f.kind == "corrupt") != (span is not None):
                    continue  # a corrupt fault is taken by a body holding its byte, alone
                if span is not None and not span[0] <= f.at < span[1]:
                    continue
                if f.start is not None and f.start != lo:
                    continue
                if f.times > 0 and fnmatch.fnmatch(path, f.pattern):
                    f.times -= 1
                    return f
        return None

    def requests(self, pattern: str = "*", *, method: str = "GET") -> list[Record]:
        """The logged requests whose path matches ``pattern``."""
        with self.lock:
            return [r for r in self.log if r.method == method and fnmatch.fnmatch(r.path, pattern)]

    def bytes_sent(self, pattern: str = "*") -> int:
        return sum(r.sent for r in self.requests(pattern))

    def clear_log(self) -> None:
        with self.lock:
            self.log.clear()

    def wait_body(self, pattern: str, nbytes: int, timeout: float = 30.0) -> None:
        """Block until the server has sent ``nbytes`` of a body whose path matches."""

        def sent() -> bool:
            return any(fnmatch.fnmatch(r.path, pattern) and r.sent >= nbytes for r in self.log)

        with self.body_started:
            if not self.body_started.wait_for(sent, timeout=timeout):
                raise TimeoutError(f"no body of {pattern} reached {nbytes} bytes")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[lo, hi)`` for a Range header; None for no or an unsatisfiable range."""
    m = _RANGE.match(header or "")
    if m is None:
        return None
    a, b = m.group(1), m.group(2)
    if a == "":
        lo, hi = max(0, size - int(b)), size
    else:
        lo, hi = int(a), (min(int(b) + 1, size) if b else size)
    return (lo, hi) if lo < hi else (size, size)


class _Handler(BaseHTTPRequestHandler):
    """Answers one connection's requests for a :class:`RangeServer`."""

    protocol_version = "HTTP/1.1"
    srv: RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        rec = Record(self.command, path, self.headers.get("Range"), 0, start=time.time())
        rec.headers = dict(self.headers.items())
        rec.client = (str(self.client_address[0]), int(self.client_address[1]))
        with self.srv.lock:
            self.srv.log.append(rec)
        if self.srv.latency:
            time.sleep(self.srv.latency)
        try:
            self._answer(path, rec, body)
        except OSError:  # the client went away (a timeout, a test that is done)
            self.close_connection = True
        finally:
            rec.end = time.time()

    def _answer(self, path: str, rec: Record, body: bool) -> None:
        m = _RANGE.match(self.headers.get("Range") or "")
        asked = int(m.group(1)) if m and m.group(1) else None
        fault = self.srv.take_fault(path, lo=asked)
        if fault is not None and fault.kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            return self._empty(rec, fault.status, headers)
        target = (self.srv.root / path.lstrip("/")).resolve()
        if self.srv.root not in target.parents or not target.is_file():
            return self._empty(rec, 404, {})
        st = target.stat()
        size = st.st_size
        etag = f'"{size:x}-{st.st_mtime_ns:x}"'
        if self.headers.get("If-None-Match") == etag:
            return self._empty(rec, 304, {"ETag": etag})
        rng = _parse_range(self.headers.get("Range"), size)
        status, lo, hi = (206, *rng) if rng else (200, 0, size)
        if rng and lo >= size:
            return self._empty(rec, 416, {"Content-Range": f"bytes */{size}"})
        if fault is not None and fault.kind == "long" and status == 206:
            return self._long(rec, target, lo, hi, size, fault)
        if fault is not None and fault.kind == "wide" and status == 206:
            lo, hi = max(0, lo - fault.at), min(size, hi + fault.after)
        if fault is not None and fault.kind == "full":
            status, lo, hi = 200, 0, size  # a server that ignores Range
        if fault is not None and fault.kind == "swap" and fault.other:
            swapped = (self.srv.root / fault.other.lstrip("/")).resolve()
            if swapped.is_file() and swapped.stat().st_size == size:
                target = swapped  # another object's bytes under this name
        rec.status = status
        self.send_response(status)
        self.send_header("Content-Length", str(hi - lo))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.end_headers()
        if body:
            corrupt = self.srv.take_fault(path, (lo, hi))
            with open(target, "rb") as f:
                f.seek(lo)
                self._body(rec, f, hi - lo, fault, corrupt.at - lo if corrupt else None)

    def _body(
        self, rec: Record, f: Any, length: int, fault: Fault | None, flip: int | None
    ) -> None:
        pos = 0
        conn = _Throttle(self.srv.per_connection)
        while pos < length:
            n = min(_PIECE, length - pos)
            if fault is not None and pos < fault.after <= pos + n:
                n = fault.after - pos
            elif fault is not None and fault.kind == "trickle" and pos >= fault.after:
                n = min(fault.step, length - pos)
                time.sleep(fault.seconds)
            self.srv.throttle.take(n)
            conn.take(n)
            data = f.read(n)
            if flip is not None and pos <= flip < pos + n:
                data = bytearray(data)
                data[flip - pos] ^= 0x01
                data = bytes(data)
            self.wfile.write(data)
            self.wfile.flush()
            pos += n
            with self.srv.body_started:
                rec.sent = pos
                self.srv.body_started.notify_all()
            if fault is not None and pos == fault.after:
                if fault.kind == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault.kind == "stall":
                    time.sleep(fault.seconds)

    def _long(self, rec: Record, target: Path, lo: int, hi: int, size: int, fault: Fault) -> None:
        """A 206 running ``fault.after`` bytes past the range asked for."""
        with open(target, "rb") as f:
            f.seek(lo)
            data = f.read(hi - lo + fault.after)
        data += bytes(hi - lo + fault.after - len(data))
        if not fault.honest:
            data = data[: hi - lo] + bytes(b ^ 0x5A for b in data[hi - lo :])
        rec.status = 206
        self.send_response(206)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Range", f"bytes {lo}-{lo + len(data) - 1}/{size}")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        rec.sent = len(data)

    def _empty(self, rec: Record, status: int, headers: dict[str, str]) -> None:
        rec.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3-compatible server in a thread on 127.0.0.1; yields its endpoint url."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def moto_process(timeout: float = 30.0) -> Iterator[str]:
    """moto's S3 server in a process of its own (its own store: two threaded servers in one
    process share moto's state); yields its endpoint url once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > until:
                    raise RuntimeError(f"moto server did not start on port {port}") from None
                time.sleep(0.05)  # polling a port that is not yet open
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def s3_bucket(endpoint: str, bucket: str, monkeypatch: Any) -> Any:
    """Point boto3 (and shardkit's s3 io) at the moto ``endpoint`` with test credentials
    through ``monkeypatch``; make ``bucket`` and return a boto3 client."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    return client
