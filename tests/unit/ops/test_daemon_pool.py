"""The threads runner's pool of daemon threads: futures settle, shutdown ends the threads."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from zephon_torch.ops._daemon_pool import DaemonPool


def named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def ended(name: str) -> bool:
    deadline = time.monotonic() + 10
    while named(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not named(name)


def test_calls_settle_their_futures_with_results_and_errors_on_daemon_threads() -> None:
    pool = DaemonPool(2, "pool-results")
    assert all(t.daemon for t in named("pool-results")) and len(named("pool-results")) == 2
    done = pool.submit(sum, [1, 2, 3])
    failed = pool.submit(int, "x")
    leaving = pool.submit(exit, 3)  # a SystemExit in a call settles its future too
    assert done.result(timeout=10) == 6
    assert isinstance(failed.exception(timeout=10), ValueError)
    assert isinstance(leaving.exception(timeout=10), SystemExit)
    pool.shutdown()
    assert named("pool-results") == []
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(sum, [1])


def test_shutdown_cancels_queued_calls_and_ends_the_threads_when_called_twice() -> None:
    """A second shutdown took the first one's stop marks off the queue while cancelling
    queued calls: the threads then waited for ever."""
    pool = DaemonPool(1, "pool-twice")
    release = threading.Event()
    running = pool.submit(release.wait, 10)
    queued = [pool.submit(sum, [i]) for i in range(3)]
    while not running.running():
        time.sleep(0.01)
    pool.shutdown(wait=False, cancel_futures=True)
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    release.set()
    assert running.result(timeout=10) is True  # a running call finishes
    assert ended("pool-twice")


def test_a_pool_dropped_without_shutdown_ends_its_threads() -> None:
    pool = DaemonPool(2, "pool-dropped")
    assert pool.submit(sum, [1]).result(timeout=10) == 1
    del pool
    gc.collect()
    assert ended("pool-dropped")
