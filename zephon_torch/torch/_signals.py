"""DataLoader workers that leave the job's Ctrl-C and SIGTERM to the main process.

A terminal's Ctrl-C and a scheduler's SIGTERM before its SIGKILL (Slurm's preemption) reach the
whole process group. A torch worker died of either, and a loop whose own handler goes on to a
checkpoint then raised "DataLoader worker exited unexpectedly". Here a worker starts with both
blocked, ignores SIGINT and keeps SIGTERM blocked: one thread takes SIGTERM and ends the worker
only where the main process sent it (torch's ``terminate()``, at shutdown or at exit), as torch's
own handler does, and ends it within a second of its parent's death. Needs ``sigtimedwait``
(Linux; not macOS, whose workers keep torch's handling). Under forkserver the workers come from a
fork server of the loader's own, started with both blocked, as its children start.
"""

from __future__ import annotations

import io
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.reduction
import multiprocessing.spawn
import multiprocessing.util
import os
import signal
import threading
from typing import Any

from zephon_torch.ops._runner_worker import LEFT_TO_PARENT, signals_held

SUPPORTED = hasattr(signal, "sigtimedwait")
_PARENT_POLL_S = 1.0  # how soon a worker whose parent was killed ends


class _LeavingSignals(multiprocessing.process.BaseProcess):
    """A worker process that leaves the group's Ctrl-C and SIGTERM to its starter."""

    _starter = 0
    _direct = True  # the starter is the parent (not a forkserver)

    def start(self) -> None:
        """Start it with both signals blocked (the child inherits the mask): a signal in its
        seconds of imports (spawn) killed it before it could leave them."""
        self._starter = os.getpid()
        with signals_held():
            super().start()

    def run(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # ignored from now
        # SIGTERM stays blocked here and in every thread this process starts: none but the
        # watch takes it (torch's handler, set next, would end the worker on anyone's). The
        # parent to watch is the starter, which a forkserver's child learns from the server
        parent = self._starter if self._direct else os.getppid()
        watch = threading.Thread(
            target=_watch, args=(self._starter, parent), daemon=True, name="zephon-sigterm"
        )
        watch.start()
        os.register_at_fork(after_in_child=_as_before)
        super().run()


def _as_before() -> None:
    """A process forked from a worker (`os.fork` in the user's map) takes both signals again. One
    started by exec (``subprocess``, spawn) keeps SIGTERM blocked and SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LEFT_TO_PARENT)


def _watch(starter: int, parent: int) -> None:
    """End this worker, as torch's handler does, on the SIGTERM its starter sends (torch's
    ``terminate()``, and multiprocessing's at exit: ignored, that one waited for ever); and
    once its parent has gone. torch's watchdog looks only between batches: one that took
    minutes kept an orphan that the group's SIGTERM had ended."""
    while os.getppid() == parent:
        taken = signal.sigtimedwait({signal.SIGTERM}, _PARENT_POLL_S)
        if taken is not None and taken.si_pid == starter:
            os._exit(0)
    os._exit(1)


class _Fork(_LeavingSignals, multiprocessing.context.ForkProcess):
    pass


class _Spawn(_LeavingSignals, multiprocessing.context.SpawnProcess):
    def _bootstrap(self, parent_sentinel: Any = None) -> int:
        """End as a forked worker does, with ``os._exit`` once multiprocessing's own ending is
        done (its finalizers, threads, flushed streams), not through the interpreter's: that
        stopped the queue's feeder thread mid-pickle of a tensor (torch's worker gives up
        flushing it at shutdown), inside a C++ frame that cannot unwind, and the worker died
        of "terminate called without an active exception" (SIGABRT), which the main process
        then raised as "DataLoader worker (pid ...) is killed by signal: Aborted"."""
        os._exit(super()._bootstrap(parent_sentinel))  # type: ignore[misc]


class _ForkServer(_LeavingSignals, multiprocessing.context.ForkServerProcess):
    _direct = False

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _ForkServerPopen(process_obj)


# The loader's fork server, not multiprocessing's: one the program started itself (an earlier
# Pool, a plain DataLoader) took the group's SIGTERM, and its children, the workers, then ended
# (their parent gone); one the loader started held both signals blocked in every process the
# program forked from it later (a Pool of its own, whose terminate() then waited for ever)
_SERVER = multiprocessing.forkserver.ForkServer()


class _ForkServerPopen(multiprocessing.popen_forkserver.Popen):
    """A worker started by `_SERVER` in multiprocessing's fork-server protocol: the child's
    preparation data and the process, pickled with this start as the spawning one (which
    gathers the descriptors they hold in ``_fds``), go down a new connection whose other end
    answers the child's pid, and later its exit code."""

    def _launch(self, process_obj: Any) -> None:
        program = getattr(multiprocessing.forkserver._forkserver, "_preload_modules", None)
        if program is not None:  # the program's `set_forkserver_preload`, for a server to start
            _SERVER.set_forkserver_preload(program)
        payload = _for_the_child(self, process_obj)
        self.sentinel, data = _SERVER.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        # the child takes its parent for alive while a copy of the data end stays open here
        kept = os.dup(data)
        self.finalizer = multiprocessing.util.Finalize(self, _close, (kept, self.sentinel))
        with open(data, "wb") as sent:
            sent.write(payload)
        self.pid = multiprocessing.forkserver.read_signed(self.sentinel)


def _for_the_child(popen: Any, process_obj: Any) -> bytes:
    """What a fork server's child reads: its preparation data, then the process object."""
    preparation = multiprocessing.spawn.get_preparation_data(process_obj._name)
    out = io.BytesIO()
    multiprocessing.context.set_spawning_popen(popen)
    try:
        for part in (preparation, process_obj):
            multiprocessing.reduction.dump(part, out)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    return out.getvalue()


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _ForkContext(multiprocessing.context.ForkContext):
    Process = _Fork


class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _Spawn


class _ForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _ForkServer


_CONTEXTS: dict[str, type[multiprocessing.context.BaseContext]] = {
    "fork": _ForkContext,
    "spawn": _SpawnContext,
    "forkserver": _ForkServerContext,
}
_STOCK = (
    multiprocessing.context.ForkContext,
    multiprocessing.context.SpawnContext,
    multiprocessing.context.ForkServerContext,
    multiprocessing.context.DefaultContext,
)


def leaving_signals(context: Any) -> Any:
    """``context`` (a start method's name, a multiprocessing context or None: the default),
    whose processes leave the group's signals to the main process; a context of the user's own
    making (its own Process class) is kept as it is."""
    if not SUPPORTED:
        return context
    if context is None:
        context = multiprocessing.get_context()
    if isinstance(context, str):
        context = multiprocessing.get_context(context)
    if type(context) not in _STOCK:  # ours already, or the user's own
        return context
    return _CONTEXTS[context.get_start_method()]()
