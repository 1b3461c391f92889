"""Tokenizer batch encodes in flight, waited for as the interpreter exits.

A thread still inside a tokenizer's native batch encode when the interpreter is torn down is
stopped there as it returns, and with tokenizers before 0.23 (seen with 0.22.1 on Python 3.10
and 3.11) that aborts the whole process: "FATAL: exception not rethrown", exit code 134, after
a loop left by ``break`` whose script then ended. Closing a threads runner waits a second for
the chunk it runs (a ``map`` may never return); a chunk's encode took longer on a busy machine,
so the exit hook then waits for the encodes in flight, which end by themselves, for at most
``EXIT_WAIT_S``, and no encode starts after it has begun.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

EXIT_WAIT_S = 30.0


class Exiting(RuntimeError):
    """An encode asked for while the interpreter exits: the chunk it was for is not read."""


class Encodes:
    """A count of the encodes running, and whether the process is exiting."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """None running, not exiting (a forked child has none of its parent's threads)."""
        self._changed = threading.Condition()
        self._running = 0
        self._exiting = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Count an encode while it runs.

        Raises:
            Exiting: once ``drain`` has begun.
        """
        with self._changed:
            if self._exiting:
                raise Exiting("the interpreter is exiting: no more tokenizing")
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def drain(self, timeout: float = EXIT_WAIT_S) -> bool:
        """Refuse new encodes and wait up to ``timeout`` seconds for the running ones to end;
        returns whether they did."""
        with self._changed:
            self._exiting = True
            return self._changed.wait_for(lambda: self._running == 0, timeout)


ENCODES = Encodes()


os.register_at_fork(after_in_child=ENCODES.reset)
