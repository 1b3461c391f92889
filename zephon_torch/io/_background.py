"""Background jobs on daemon threads: the process exits without waiting for them.

Prefetch downloads run here, not in a `ThreadPoolExecutor`, whose threads the interpreter joins
at exit after running every job still queued: a run that stopped early (or failed) then waited,
each queued download retried against a store that may be gone, for minutes. A job cut off at
exit leaves a partial download, which the shard cache sweeps as it does a killed process's.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from zephon_torch._caller import Site, adopt_site, user_site

_log = logging.getLogger(__name__)


class Background:
    """Runs submitted jobs in order on up to `threads` daemon threads, started as jobs come and
    ended when none is left. Jobs must not raise: what they do not handle is lost.

    Args:
        threads: the most threads at once; at least 1.
        name: the threads' name.
    """

    def __init__(self, threads: int, name: str) -> None:
        self.threads = max(1, threads)
        self.name = name
        self._lock = threading.Lock()
        # each job, with the user's line its warnings point at (its submitter's)
        self._jobs: deque[tuple[Callable[..., Any], tuple[Any, ...], Site | None]] = deque()
        self._running = 0

    def submit(self, job: Callable[..., Any], *args: Any) -> None:
        """Queue ``job(*args)``; returns at once."""
        with self._lock:
            self._jobs.append((job, args, user_site()))
            if self._running < self.threads:
                self._running += 1
                threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def clear(self) -> list[tuple[Any, ...]]:
        """Drops the jobs not started yet (those running go on); returns their arguments."""
        with self._lock:
            dropped = [args for _, args, _ in self._jobs]
            self._jobs.clear()
        return dropped

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._running -= 1
                    return
                job, args, site = self._jobs.popleft()
            adopt_site(site)
            try:
                job(*args)
            except Exception:  # a job's own bug: the thread goes on with the others
                _log.debug("a background job failed", exc_info=True)
