"""A reverse proxy on 127.0.0.1 in front of an object-store emulator (moto, the GCS
emulator, Azurite) that answers some requests itself: what a store under load does to
writes. Every request is logged (method, path with query, status answered).

Faults are queued per method and a regular expression on the path with its query; each
hits the next ``times`` matching requests:

- ``slowdown``: 503 with S3's ``SlowDown`` error body (Azure's ``ServerBusy`` code header);
- ``status``: answer ``status`` with an empty body;
- ``lost``: forward the request (the store does it) and cut the connection before the
  answer (a dropped connection whose request took effect);
- ``reset``: cut the connection without forwarding;
- ``cut``: forward the request and send the answer's head and its body's first ``after``
  bytes, then cut the connection (a read dropped mid-body).

Header values naming the upstream (a GCS resumable session's ``Location``) are rewritten
to name the proxy, so a client keeps going through it.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FaultProxy", "ProxyFault"]

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class ProxyFault:
    method: str
    pattern: str  # a regular expression searched in the path with its query
    kind: str  # "slowdown" | "status" | "lost" | "reset" | "cut"
    times: int = 1
    status: int = 503
    after: int = 0  # "cut": the body's bytes sent before the cut


class FaultProxy:
    """The proxy (see the module docstring); ``url`` is its address."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults: list[ProxyFault] = []
        self.log: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def add(self, method: str, pattern: str, kind: str, **kwargs: Any) -> ProxyFault:
        f = ProxyFault(method, pattern, kind, **kwargs)
        with self.lock:
            self.faults.append(f)
        return f

    def take(self, method: str, target: str) -> ProxyFault | None:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and re.search(f.pattern, target):
                    f.times -= 1
                    return f
        return None

    def answered(self, method: str, pattern: str = "") -> list[int]:
        """The statuses answered to requests matching (0: none, the connection was cut)."""
        with self.lock:
            return [s for m, t, s in self.log if m == method and re.search(pattern, t)]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._relay()

    def do_HEAD(self) -> None:
        self._relay()

    def do_PUT(self) -> None:
        self._relay()

    def do_POST(self) -> None:
        self._relay()

    def do_DELETE(self) -> None:
        self._relay()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                line = self.rfile.readline()
                raw += line
                n = int(line.split(b";")[0].strip() or b"0", 16)
                raw += self.rfile.read(n + 2)
                if n == 0:
                    return raw
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        body = self._body()
        fault = self.proxy.take(self.command, self.path)
        status = 0
        try:
            if fault is not None and fault.kind == "reset":
                self.close_connection = True
                return
            if fault is not None and fault.kind in ("slowdown", "status"):
                status = fault.status
                data = _SLOWDOWN if fault.kind == "slowdown" else b""
                self.send_response(status)
                if fault.kind == "slowdown":
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("x-ms-error-code", "ServerBusy")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return
            status, headers, data = self._forward(body)
            if fault is not None and fault.kind == "lost":
                status = 0
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, self._rewrite(v))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault is not None and fault.kind == "cut":
                self.wfile.write(data[: fault.after])
                self.wfile.flush()
                status = 0
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            with self.proxy.lock:
                self.proxy.log.append((self.command, self.path, status))

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() != "connection":
                    conn.putheader(k, v)
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _rewrite(self, value: str) -> str:
        host, port = self.proxy.upstream
        mine = self.proxy.url.removeprefix("http://")
        return value.replace(f"{host}:{port}", mine).replace(f"localhost:{port}", mine)
