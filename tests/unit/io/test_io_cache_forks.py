"""The shard cache's descriptors across a fork: a DataLoader worker forked while a thread of
its parent evicts must not keep that thread's lock, nor the shard it deletes."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import types
from pathlib import Path

import pytest

from tests.helpers import cache_item, cache_writer
from zephon_torch.io import _cache_folder
from zephon_torch.io._shard_cache import ShardCache


def test_a_child_forked_while_a_thread_evicts_a_shard_does_not_keep_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evicter holds an exclusive lock on the shard it deletes, for a moment: a worker
    forked then kept a copy of that descriptor, so a reader that had opened the shard just
    before waited for the lock (holding the pins of its process) until the worker exited, and
    the deleted shard's disk space stayed taken as long."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    old = cache_item("a.bin", 100)
    cache.ensure(old, cache_writer(b"a" * 100), pin=False)
    locked, go = threading.Event(), threading.Event()
    real = fcntl.flock

    def paused_flock(fd: int, operation: int) -> None:
        real(fd, operation)
        if operation & fcntl.LOCK_EX and threading.current_thread() is evicter:
            locked.set()  # the shard to delete is locked: hold the evicter here over the fork
            go.wait(10)

    monkeypatch.setattr(
        _cache_folder,
        "fcntl",
        types.SimpleNamespace(
            flock=paused_flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB, LOCK_SH=fcntl.LOCK_SH
        ),
    )
    evicter = threading.Thread(
        target=cache.ensure,
        args=(cache_item("b.bin", 100), cache_writer(b"b" * 100)),
        kwargs={"pin": False},
    )
    evicter.start()
    assert locked.wait(10)
    child = os.fork()
    if child == 0:  # a DataLoader worker: lives on for a while
        time.sleep(6)
        os._exit(0)
    try:
        read: list[float] = []

        def reader() -> None:  # opens the shard, then waits for the evicter's lock
            with cache.open(old, cache_writer(b"a" * 100)) as path:
                assert Path(path).read_bytes() == b"a" * 100
                read.append(time.monotonic())

        thread = threading.Thread(target=reader)
        thread.start()
        time.sleep(0.3)
        released = time.monotonic()
        go.set()
        evicter.join(10)
        thread.join(10)
        assert read and read[0] - released < 2.5  # not held until the child exits
        held = [os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")]
        assert not [target for target in held if "a.bin" in target]
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
