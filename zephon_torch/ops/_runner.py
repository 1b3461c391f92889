"""Where per-document work runs: a pool of threads, of spawned processes, or inline.

The fused chain (fetch, then the user's maps and filters, then tokenize) is sent to each worker
process once at start-up; a task then carries only (source, pointers) and returns documents
with their tokens. Results come back in submission order (each reader keeps its own queue of
futures) while tasks execute in any order, so one multi-megabyte document holds up only the
reader that needs it next. ``inline`` runs each chunk on the thread that submits it: for
pre-tokenized data, where a document costs a slice, a hand-off to another thread costs more
than the work (and its wake-ups fight the packer for the GIL).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Literal

from zephon_torch.errors import ConfigError
from zephon_torch.ops._chain_file import release, write_chain
from zephon_torch.ops._daemon_pool import DaemonPool
from zephon_torch.ops._encodes import ENCODES
from zephon_torch.ops._pool_watch import PoolWatch
from zephon_torch.ops._runner_worker import (
    Chain,
    Chunk,
    Raised,
    SpawnContext,
    init_worker,
    run_in_worker,
)
from zephon_torch.ops._spawn_main import check_main
from zephon_torch.work.pointers import PointerSpan

RunnerKind = Literal["threads", "processes", "inline"]
RUNNERS = ("threads", "processes", "inline")


_OPEN_RUNNERS: weakref.WeakSet[Runner] = weakref.WeakSet()
# the threads of the process pools closed (shut down without waiting), joined at exit before
# concurrent.futures' own exit hook: on Python < 3.12 that hook writes to each pool thread's
# wake-up pipe without a lock while the thread, ending, closes it: "Exception ignored ...
# Bad file descriptor" at the exit of a loop that ended and exited at once (a CI run)
_CLOSED_POOLS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _join_closed_pools() -> None:
    """Wait for the closed pools' threads (as concurrent.futures' hook, run next, does)."""
    for thread in list(_CLOSED_POOLS):
        thread.join()


if sys.version_info < (3, 12):  # registered after concurrent.futures' hook: run before it
    threading._register_atexit(_join_closed_pools)  # type: ignore[attr-defined]
_JOIN_S = 1.0  # how long closing a threads runner waits for a chunk still running


def _end_at_exit() -> None:
    """Close the runners still open as the interpreter exits: a loop left by ``break`` or an
    error (Ctrl-C) without closing its iterator left them open. concurrent.futures' own exit
    hook then waited for a process worker's map to return, for ever if it was stuck. Then wait
    for the tokenizer encodes still running (see ``ops._encodes``): a thread inside one as the
    interpreter is torn down can abort the process. Registered after concurrent.futures' hook,
    so run before it."""
    for runner in list(_OPEN_RUNNERS):
        runner.close()
    ENCODES.drain()


# threading's exit hooks, not atexit's: concurrent.futures joins its pools in one, which runs
# before atexit; the hooks run last registered first (a private hook, guarded)
getattr(threading, "_register_atexit", lambda _hook: None)(_end_at_exit)
# a forked child (a DataLoader worker runs threading's exit hooks too) must not end the
# parent's pools: their processes are the parent's
os.register_at_fork(after_in_child=_OPEN_RUNNERS.clear)


def _broken(error: BrokenProcessPool, how: str | None = None) -> BrokenProcessPool:
    """The pool's error, saying what is known of what broke it: the pool's cause where it
    gives one (it failed to take a result) and no process was seen to end (``how`` None: see
    `PoolWatch`), else how a process ended, what may have ended it and what to do."""
    cause = error.__cause__
    if cause is not None and how is None:
        lines = [line.strip() for line in str(cause).splitlines()]
        said = [line for line in lines if line not in ("", "'''")]
        reason = said[-1] if said else type(cause).__name__
        clear = BrokenProcessPool(f"the process pool of runner='processes' broke: {reason}")
    else:
        ended = f" ({how})" if how else ""
        killed = how in (None, "", "killed by SIGKILL")  # the out-of-memory killer's signal
        why = "it was killed (out of memory?)" if killed else "its code failed or it was stopped"
        clear = BrokenProcessPool(
            f"a process of runner='processes' ended abruptly{ended}: {why}, or failed as it "
            "started (its error is printed above). The processes are spawned, so they import "
            "the main script again: a script must run the pipeline under "
            '`if __name__ == "__main__":`'
        )
    clear.__cause__ = error
    return clear


def _raising(pending: Future[bytes], watch: PoolWatch) -> Future[Chunk]:
    """`pending`'s outcome, unpickled, with a returned `Raised` as the error it holds
    (``watch``: whether and how a process of the pool was seen to end, see `_broken`).

    Cancelling the result leaves `pending` to run (its outcome is then not unpickled): only
    the pool's own thread may cancel its futures (see `Runner.close`)."""
    result: Future[Chunk] = Future()

    def settle(done: Future[bytes]) -> None:
        if done.cancelled():
            result.cancel()
            return
        if not result.set_running_or_notify_cancel():
            return  # nobody waits for it: not unpickled
        error = done.exception()
        value: Chunk | Raised | None = None
        if isinstance(error, BrokenProcessPool):
            error = _broken(error, watch.seen_end())
        elif error is None:
            try:
                value = pickle.loads(done.result())
            except Exception as exc:  # this chunk's own failure (out of memory): its reader's
                error = exc
        if isinstance(value, Raised):
            error = value.error
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(value)  # type: ignore[arg-type]

    pending.add_done_callback(settle)
    return result


class Runner:
    """Runs chunks of the chain on ``parallelism`` threads or processes, or inline.

    Args:
        chain: the fused per-document chain, or the columnar token chain.
        parallelism: number of workers (``inline``: unused).
        kind: ``"threads"`` (daemon threads, see `DaemonPool`; the tokenizer backend
            releases the GIL), ``"processes"`` (spawned; user functions and the values
            they return must be picklable) or ``"inline"`` (the submitting thread, at once).
    """

    def __init__(self, chain: Chain, *, parallelism: int, kind: RunnerKind) -> None:
        if parallelism < 1:
            raise ConfigError(f"`parallelism` must be a positive int, got {parallelism!r}")
        if kind not in RUNNERS:
            raise ConfigError(f"`runner` must be one of {list(RUNNERS)}, got {kind!r}")
        self.chain = chain
        self.kind = kind
        self._executor: Executor | None = None
        self._removal: Callable[[], object] | None = None  # removes the chain's file
        self._pending: set[Future[bytes]] = set()  # the processes' chunks not yet done
        self._watch: PoolWatch | None = None  # of the processes, where they are used
        self._closed = False
        if kind == "inline":
            pass
        elif kind == "threads":
            self._executor = DaemonPool(parallelism, "zephon-docs")
            _OPEN_RUNNERS.add(self)
        elif multiprocessing.current_process().daemon:
            raise ConfigError(
                "runner='processes' cannot start its processes here: this is a daemonic "
                "process (a torch DataLoader worker), which may not have children; use "
                "runner='threads' or 'inline' with DataLoader workers, or no workers"
            )
        else:
            check_main(
                chain, what="the processes of runner='processes'", instead="use runner='threads'"
            )
            try:
                payload = pickle.dumps(chain)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise ConfigError(
                    "runner='processes' needs picklable operators (module-level functions, no "
                    f"lambdas or closures): {exc}"
                ) from exc
            path, lock = write_chain(payload)
            self._removal = weakref.finalize(self, release, path, lock)
            self._executor = ProcessPoolExecutor(
                parallelism,
                mp_context=SpawnContext(),
                initializer=init_worker,
                initargs=(path, os.getpid()),
            )
            self._watch = PoolWatch(self._executor)
            _OPEN_RUNNERS.add(self)

    def submit(self, source: int, span: PointerSpan) -> Future[Chunk]:
        """Schedule one chunk; the future yields its documents in stream order.

        Raises:
            BrokenProcessPool: explained (see `_broken`), where the pool broke.
        """
        if self._executor is None:
            return _done(self.chain, source, span)
        if self._watch is None:
            return self._executor.submit(self.chain, source, span)
        try:
            pending = self._executor.submit(run_in_worker, source, span)
        except BrokenProcessPool as error:
            broke = self._breaking(error)
            raise _broken(broke, self._watch.seen_end()) from broke
        self._pending.add(pending)
        pending.add_done_callback(self._pending.discard)
        return _raising(pending, self._watch)

    def _breaking(self, refused: BrokenProcessPool) -> BrokenProcessPool:
        """The error that broke the pool, which has just ``refused`` a chunk: the one it gives
        every chunk it held (with its cause, where it has one), set right after it began to
        refuse; ``refused`` where it held none (a process ended while idle)."""
        held = list(self._pending)
        wait(held, timeout=10)
        errors = [f.exception() for f in held if f.done() and not f.cancelled()]
        return next((e for e in errors if isinstance(e, BrokenProcessPool)), refused)

    def run_now(self, source: int, span: PointerSpan) -> Chunk:
        """Run one chunk on the calling thread (used to rebuild open bins on restore)."""
        return self.chain(source, span)

    def close(self, deadline: float | None = None) -> None:
        """Stop the workers; pending chunks are cancelled, and the processes are ended (a
        chunk's result would be thrown away, a stuck map would hold the process at exit, and
        an idle worker killed just before holds the lock the others wait on for their stop);
        threads that run one end once it returns, without holding the process (waited for
        until ``deadline``, a `time.monotonic` time; default: a second from now). Closing
        again does nothing: it waited again for a thread still running its chunk.

        The pool's futures are left to its own thread to cancel (``cancel_futures``), which
        drops them from its table as it does: one cancelled here stayed there, and where that
        thread then found the processes ended before it saw the shutdown, Python < 3.12 failed
        on it (InvalidStateError) and the thread died, skipping the pool's clean-up."""
        if self._closed:
            return
        self._closed = True
        manager = getattr(self._executor, "_executor_manager_thread", None)  # shutdown drops it
        if isinstance(manager, threading.Thread):
            _CLOSED_POOLS.add(manager)  # joined at exit (see _join_closed_pools)
        if self._watch is not None:
            self._watch.stop()
        if isinstance(self._executor, ProcessPoolExecutor):
            self._pending.clear()
            _terminate(self._executor)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if isinstance(self._executor, DaemonPool):  # a chunk running ends in moments, or
            # (a map that never returns) is left behind
            self._executor.join(
                _JOIN_S if deadline is None else max(0.0, deadline - time.monotonic())
            )
        _OPEN_RUNNERS.discard(self)
        if self._removal is not None:
            self._removal()


def _terminate(executor: ProcessPoolExecutor) -> None:
    """Shut ``executor`` down and end its processes now, as Python 3.14's `terminate_workers`
    does. Then close this process's end of the pipe they send results on, which it never
    writes: a process ended in the middle of sending one left a message that the pool's
    thread, reading it, would wait for the rest of for ever (and the interpreter joins that
    thread at exit); with no writer left, it reads the end of the pipe and stops."""
    processes = dict(getattr(executor, "_processes", None) or {})  # shutdown drops it
    results = getattr(executor, "_result_queue", None)
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes.values():
        with contextlib.suppress(ValueError, ProcessLookupError):  # ended meanwhile
            if process.is_alive():
                process.terminate()
    writer = getattr(results, "_writer", None)
    if writer is not None:
        writer.close()


def _done(chain: Chain, source: int, span: PointerSpan) -> Future[Chunk]:
    """The chunk run now, as a finished future (its error, if any, raised by ``result``).

    The error's traceback holds this frame: it keeps no future (made by `_finished`), which
    made a cycle (error, traceback, frame, future) that kept the pipeline that raised, and its
    datasets' open files, until a full garbage collection."""
    try:
        return _finished(chain(source, span), None)
    except Exception as exc:
        return _finished(None, exc)


def _finished(chunk: Chunk | None, error: Exception | None) -> Future[Chunk]:
    future: Future[Chunk] = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(chunk)  # type: ignore[arg-type]
    return future
