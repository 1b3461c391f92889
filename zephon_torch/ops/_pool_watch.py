"""A watch on the processes of a `runner="processes"` pool: one that ends breaks the pool.

The pool's own thread notices a process that ends only between results. A process killed
halfway through sending one (the out-of-memory killer ends the largest process: often one
sending a large chunk) left that thread reading the rest for ever, since the pipe's other
writers (the parent, the other workers) keep it open, and every reader waited with it. The
watch then ends the other workers and closes the parent's end of that pipe: the thread reads
the end of the pipe and fails every chunk with `BrokenProcessPool`.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import multiprocessing.process
import signal
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor

_WATCH_S = 0.5  # how soon a process the pool has just started is watched


class PoolWatch:
    """Watches ``executor``'s processes until `stop`; `ended` is set where one ended first.

    Args:
        executor: the pool; held weakly (a pool dropped unclosed ends the watch).
    """

    def __init__(self, executor: ProcessPoolExecutor) -> None:
        self.ended = threading.Event()
        self.how = ""  # how the process that ended did: "killed by SIGKILL", "exited with 3"
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # the watch's and `stop`'s hands on the pool, one at a time
        pool = self._pool = weakref.ref(executor)
        threading.Thread(target=self._watch, args=(pool,), daemon=True, name="zephon-watch").start()

    def seen_end(self) -> str | None:
        """How a process of the pool ended ("" where that cannot be read), or None where none
        did: the one this watch saw end, else one the pool's own thread saw end first (any
        still there that exited other than by SIGKILL, which the pool sends the rest)."""
        if self.ended.is_set():
            return self.how
        executor = self._pool()
        processes = list((getattr(executor, "_processes", None) or {}).values())
        try:  # a process's sentinel is ready a moment before its exit code can be read
            sentinels = [process.sentinel for process in processes]
            ready = multiprocessing.connection.wait(sentinels, timeout=0)
        except (ValueError, OSError):  # closed meanwhile: the pool is closing
            return None
        ended = [
            how
            for process, sentinel in zip(processes, sentinels)
            if sentinel in ready and (how := _how_it_ended(process, wait=1))
        ]
        if not ended:
            return None
        return next((how for how in ended if how != "killed by SIGKILL"), ended[0])

    def stop(self) -> None:
        """End the watch (the pool is being closed): a process ending from now is no fault."""
        with self._lock:
            self._stopped.set()

    def _watch(self, pool: weakref.ref[ProcessPoolExecutor]) -> None:
        while not self._stopped.is_set():
            executor = pool()
            if executor is None or executor._broken:  # the pool's thread saw to it
                return
            processes = list((getattr(executor, "_processes", None) or {}).values())
            del executor
            try:
                sentinels = [process.sentinel for process in processes]
            except ValueError:  # a process closed: the pool is closing
                return
            if not sentinels:
                self._stopped.wait(_WATCH_S)
            elif ready := multiprocessing.connection.wait(sentinels, timeout=_WATCH_S):
                self.how = _how_it_ended(processes[sentinels.index(ready[0])], wait=1)
                self._break(pool)
                return

    def _break(self, pool: weakref.ref[ProcessPoolExecutor]) -> None:
        """Mark the pool broken (a chunk submitted now is refused, no process is started to
        take it), end its processes and close the parent's end of the result pipe."""
        with self._lock:
            executor = pool()
            if self._stopped.is_set() or executor is None:
                return
            with executor._shutdown_lock:  # as a submit checks, and starts processes
                if executor._broken:
                    return
                message = "a process of runner='processes' ended abruptly"
                executor._broken = message  # type: ignore[assignment]  # a str, as the pool's
            self.ended.set()
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                with contextlib.suppress(ValueError, ProcessLookupError):  # ended meanwhile
                    process.terminate()
            writer = getattr(getattr(executor, "_result_queue", None), "_writer", None)
            if writer is not None:
                writer.close()


def _how_it_ended(process: multiprocessing.process.BaseProcess, *, wait: float) -> str:
    """How ``process`` ended: the signal that killed it, or its exit code ("" where it has not
    ended within ``wait`` seconds, or that cannot be read).

    The pool's own thread may reap the process first: its status is then read here only once
    that thread has recorded it (our own wait finds no child), so it is asked again a while."""
    deadline = time.monotonic() + wait
    try:
        process.join(wait)
        code = process.exitcode
        while code is None and time.monotonic() < deadline:
            time.sleep(0.01)
            code = process.exitcode
    except (ValueError, AssertionError):  # closed meanwhile: the pool is closing
        return ""
    if code is None:
        return ""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"
