"""A reverse proxy on loopback that runs a hook before it forwards each request, so that a test
can change the store at one exact moment of a client's requests (between s3fs's own HEAD and
its range GETs, say), which no timing could stage reliably, or answer a request itself."""

from __future__ import annotations

import http.client
import http.server
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.loopback import serve_in_thread

# (method, path, headers) -> None to forward the request, or the (status, body) to answer (a
# body starting with "<" is sent as XML, S3's and Azure's, any other as JSON, GCS's)
Hook = Callable[[str, str, dict[str, str]], "tuple[int, bytes] | None"]


@contextmanager
def hooked_proxy(upstream: str, before: Hook, body_rate: int = 0) -> Iterator[str]:
    """Yields the URL of a proxy to `upstream` (``http://host:port``) that calls `before` with
    each request's method, path and headers, then forwards it, or answers what `before`
    returned; stopped on exit. `body_rate`: bytes a second each forwarded answer's body is
    sent at, in 64 KiB pieces (0: at once)."""
    host, port = upstream.removeprefix("http://").split(":")

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = dict(self.headers.items())
            answer_given = before(self.command, self.path, headers)
            if answer_given is not None:
                status, data = answer_given
                self.send_response(status)
                kind = "application/xml" if data.startswith(b"<") else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return
            upstream = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            finally:
                upstream.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            piece = 1 << 16 if body_rate else max(len(data), 1)
            for start in range(0, len(data), piece):
                self.wfile.write(data[start : start + piece])
                if body_rate:
                    time.sleep(piece / body_rate)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

    with serve_in_thread(Forward) as url:
        yield url
