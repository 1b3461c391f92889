"""An HTTP server on loopback, run in a thread for as long as a test needs it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_in_thread(handler: Callable[..., Any]) -> Iterator[str]:
    """Serves `handler` (a request handler class or factory) on 127.0.0.1; yields the base
    URL, and stops the server and its thread on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
