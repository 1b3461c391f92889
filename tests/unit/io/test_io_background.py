"""`Background`: the daemon-thread job queue prefetch downloads run on."""

from __future__ import annotations

import threading
import time

from zephon_torch.io._background import Background


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_jobs_run_in_order_past_a_failing_one_on_bounded_daemon_threads_that_end() -> None:
    pool = Background(1, "bg-order")
    done: list[int] = []
    gate = threading.Event()
    pool.submit(gate.wait)
    for n in range(5):
        pool.submit(done.append, n)
    pool.submit(int, "not a number")  # raises: the others still run
    pool.submit(done.append, 5)
    assert [t.daemon for t in _threads("bg-order")] == [True]  # one thread, however many jobs
    gate.set()
    deadline = time.monotonic() + 30
    while (len(done) < 6 or _threads("bg-order")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == [0, 1, 2, 3, 4, 5]
    assert not _threads("bg-order")  # ended once nothing was left


def test_jobs_share_up_to_the_threads_given() -> None:
    pool = Background(3, "bg-width")
    gate = threading.Event()
    started: list[int] = []

    def job(n: int) -> None:
        started.append(n)
        gate.wait()

    for n in range(6):
        pool.submit(job, n)
    deadline = time.monotonic() + 30
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_threads("bg-width")) == 3
    assert sorted(started) == [0, 1, 2]
    gate.set()
    while (len(started) < 6 or _threads("bg-width")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(started) == list(range(6))
    assert not _threads("bg-width")


def test_clear_drops_the_jobs_not_started_and_returns_their_arguments() -> None:
    pool = Background(1, "bg-clear")
    started, gate = threading.Event(), threading.Event()
    done: list[int] = []
    pool.submit(lambda: started.set() or gate.wait())
    assert started.wait(30)  # running: not dropped
    for n in range(4):
        pool.submit(done.append, n)
    assert pool.clear() == [(0,), (1,), (2,), (3,)]
    pool.submit(done.append, 9)  # queued after the clear: runs
    gate.set()
    deadline = time.monotonic() + 30
    while (not done or _threads("bg-clear")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == [9]
    assert pool.clear() == []
