"""Downloads that stall are cut short, so a store that stops sending cannot hold a run.

A download must receive `min_rate` bytes a second, averaged over each `rate_window` seconds;
one that does not (a stalled endpoint or load balancer, a server trickling a byte now and
then, which no socket timeout ends) is a `Stalled` attempt, retried like any transient error.
On an async file system (s3fs, gcsfs, adlfs, http) the calling thread watches the transfer and
cancels it, so a stall with no bytes at all ends too, releasing the connection; elsewhere the
rate is checked as bytes arrive, and a transfer sending nothing is left to the client's own
timeouts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

from fsspec.exceptions import FSTimeoutError

_WATCH_S = 0.5  # how often the calling thread looks at an async transfer


class Stalled(TimeoutError):
    """A download received less than its `min_rate` over a `rate_window` (transient)."""


class Pace:
    """The rate floor of one download attempt: `check(received)`, called with the bytes
    received so far, raises `Stalled` once a window closes having brought fewer than
    `min_rate * rate_window` of them (never where `min_rate` is 0); `restart()` starts the
    count again (a client restarting the transfer from byte 0)."""

    def __init__(self, min_rate: float, rate_window: float) -> None:
        self.min_rate = min_rate
        self.window = rate_window
        self._lock = threading.Lock()
        self.restart()

    @property
    def on(self) -> bool:
        return self.min_rate > 0

    def restart(self) -> None:
        with self._lock:
            self._since = time.monotonic()
            self._mark = 0

    def check(self, received: int) -> None:
        if not self.on:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._since < self.window:
                return
            got = received - self._mark
            if got < self.min_rate * self.window:
                raise Stalled(
                    f"download stalled: {got} bytes came in the last {now - self._since:.1f} s, "
                    f"under the retry policy's `min_rate` of {self.min_rate:g} bytes/s (set "
                    f"io_options={{'retry': {{'min_rate': 0}}}} to wait on a slow link)"
                )
            self._since, self._mark = now, received


def get_file(fs: Any, fs_path: str, target: str, callback: Any, pace: Pace) -> None:
    """`fs.get_file(fs_path, target, callback=callback)`, cut short as `Stalled` where it
    falls under `pace` (whose `check` `callback` calls with its progress as bytes arrive).

    On an async file system the transfer runs on its event loop while this thread checks it
    every half second, and cancels it on a stall: its connection and file are let go before
    this returns (or within a further half second), so a retry can write `target` again.
    """
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    if loop is None or not pace.on or not loop.is_running():
        fs.get_file(fs_path, target, callback=callback)
        return
    ended = threading.Event()

    async def transfer() -> None:
        try:
            await fs._get_file(fs_path, target, callback=callback)
        finally:
            ended.set()

    future = asyncio.run_coroutine_threadsafe(transfer(), loop)
    while not concurrent.futures.wait([future], timeout=_WATCH_S).done:
        try:
            pace.check(int(callback.value))
        except Stalled:
            future.cancel()
            ended.wait(_WATCH_S)
            raise
    error = future.exception()
    if isinstance(error, asyncio.TimeoutError) and not isinstance(error, Stalled):
        raise FSTimeoutError from error  # as fsspec's own `sync` raises it
    if error is not None:
        raise error
