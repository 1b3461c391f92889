"""The threads runner's pool: daemon threads running calls for futures.

Not a `ThreadPoolExecutor`, whose threads the interpreter joins at exit: a map call still
running when the loop was left (`break`, an error, Ctrl-C) held the process until it returned,
for ever where it was stuck (a pathological regex, a network call without a timeout), and
Ctrl-C did not end the script. A shut-down pool's queued calls are cancelled and each thread
ends once its running call returns; the process exits without waiting for them.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from zephon_torch._caller import Site, adopt_site, user_site
from zephon_torch.io._retry import abandoned_when

T = TypeVar("T")
# a call, and the user's line its warnings point at (that of the thread that submitted it)
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any], Site | None]


class DaemonPool(Executor):
    """``threads`` daemon threads named ``{name}_{i}``, taking calls in submission order.

    Args:
        threads: how many; at least 1.
        name: the threads' name prefix.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._abandoned = threading.Event()  # set at shutdown: running calls' retries end
        self._threads = [
            threading.Thread(
                target=_work, args=(self._jobs, self._abandoned), name=f"{name}_{i}", daemon=True
            )
            for i in range(max(1, threads))
        ]
        for thread in self._threads:
            thread.start()
        # the threads hold the queue, not the pool: a pool dropped unclosed still ends them
        self._stop = weakref.finalize(self, _stop, self._jobs, len(self._threads))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; its future holds what it returns or raises."""
        if self._closed:
            raise RuntimeError("cannot schedule new calls after shutdown")
        future: Future[T] = Future()
        self._jobs.put((future, fn, args, kwargs, user_site()))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls; ``cancel_futures``: cancel the queued ones; ``wait``: wait for
        the threads to end (else they end on their own, after their running call)."""
        self._closed = True
        self._abandoned.set()
        stops = 0  # an earlier shutdown's, not yet taken: put back
        while cancel_futures:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stops += 1
            else:
                job[0].cancel()
        for _ in range(stops):
            self._jobs.put(None)
        self._stop()
        if wait:
            for thread in self._threads:
                thread.join()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the threads to end (after ``shutdown``): a
        thread left inside native code (a tokenizer's batch encode) as the interpreter exits
        can abort the process."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


def _stop(jobs: queue.SimpleQueue[_Job | None], threads: int) -> None:
    for _ in range(threads):
        jobs.put(None)


def _work(jobs: queue.SimpleQueue[_Job | None], abandoned: threading.Event) -> None:
    with abandoned_when(abandoned):  # a read retrying a dead store ends with the pool
        while (job := jobs.get()) is not None:
            _run(*job)
            del job  # the idle thread holds no chunk


def _run(
    future: Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any, site: Site | None
) -> None:
    if not future.set_running_or_notify_cancel():
        return
    adopt_site(site)
    try:
        result = fn(*args, **kwargs)
    except BaseException as error:  # a SystemExit too: its future must settle
        future.set_exception(error)
        # the error's traceback holds this frame: its future (which holds the error) made a
        # cycle that kept the pipeline that raised, and its datasets' open files, until a
        # full garbage collection
        del future
    else:
        future.set_result(result)
