"""Run a producer generator on a background thread, ahead of the consumer, bounded.

Items are produced in order into a bounded queue; an exception in the producer is re-raised in
the consumer at the position it happened; closing the consumer stops the producer, and a
consumer still asking for items after that (or waiting for one) gets a RuntimeError.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from zephon_torch._caller import Site, adopt_site, user_site
from zephon_torch.io._retry import abandoned_when

T = TypeVar("T")

_END = object()
_JOIN_S = 1.0  # how long close() waits for the producer's thread
_CLOSED = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetcher(Generic[T]):
    """Iterate ``make()``'s items on a daemon thread, at most ``depth`` ahead.

    Args:
        make: builds the producer iterator (called on the background thread).
        depth: items buffered ahead of the consumer; at least 1.
    """

    def __init__(self, make: Callable[[], Iterator[T]], depth: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._closing = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, args=(make, user_site()), daemon=True, name="zephon-prefetch"
        )
        self._thread.start()

    def _run(self, make: Callable[[], Iterator[T]], site: Site | None) -> None:
        adopt_site(site)  # its warnings point at the line that iterates
        try:
            with abandoned_when(self._stop):  # a read retrying a dead store ends at close
                for item in make():
                    if not self._put(item):
                        return
                self._put(_END)
        except BaseException as exc:  # re-raised in the consumer
            self._put(_Failure(exc))

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        if item is _CLOSED:
            self._queue.put(_CLOSED)
            raise RuntimeError("the prefetcher was closed: it gives no more items")
        if isinstance(item, _Failure):
            self._queue.put(item)
            try:
                raise item.exc
            finally:  # the error's traceback holds this frame: no cycle through it
                del item
        return item  # type: ignore[return-value]

    def queued(self) -> int:
        """Items ready ahead of the consumer (approximate)."""
        return self._queue.qsize()

    def stop(self) -> None:
        """Tell the producer to stop after the item it is making (`close` waits for it)."""
        self._stop.set()

    def close(self, deadline: float | None = None) -> None:
        """Stop the producer; the items it made are dropped, and every later (or waiting)
        ``next`` raises instead of waiting for one that never comes. Waits a moment for its
        thread (until ``deadline``, a `time.monotonic` time; default: a second from now): one
        still making an item (a slow map, a read retrying) finishes it on its own and drops
        it, so that leaving a loop (``break``, an error, Ctrl-C) does not wait for it.
        Closing again does nothing."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if deadline is None:
            deadline = time.monotonic() + _JOIN_S
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while True:  # a put of the producer (if the join timed out) may land in between
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            try:
                self._queue.put_nowait(_CLOSED)
                return
            except queue.Full:
                continue
