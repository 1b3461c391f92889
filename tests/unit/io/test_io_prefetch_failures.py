"""Prefetch of remote shards when downloads fail or stop: a read waiting on a stopped prefetch
retries for the time it had left, a stopped prefetch is told from a failed one by its error,
and a failed download ends the prefetches waiting to retry."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest

from tests.helpers import prefetch_threads
from tests.memory_store import fresh_root, put_parquet
from tests.unit.io.test_io_prefetch import _cached_shards
from zephon_torch.io import Dataset


def _failing_downloads(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    shards: int,
    fail: Any,
    timeout: float,
    delay: float = 0.5,
) -> Dataset:
    """A memory:// dataset of `shards` Parquet shards (row n of shard s: s * 100 + n) on two
    prefetch threads, each of whose downloads first calls `fail(name, thread name)`, which
    raises to fail it; retried every `delay` seconds up to `timeout`."""
    from fsspec.implementations.memory import MemoryFileSystem

    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(shards):
        put_parquet(
            fs,
            f"{root}/part-{number}.parquet",
            pa.table({"n": [number * 100 + i for i in range(5)]}),
        )
    real = MemoryFileSystem.get_file

    def get_file(self: Any, rpath: str, lpath: str, *args: Any, **kwargs: Any) -> Any:
        if rpath.startswith(root):  # not another test's, still running down its threads
            fail(rpath.rsplit("/", 1)[-1], threading.current_thread().name)
        return real(self, rpath, lpath, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "get_file", get_file)
    retry = {"attempts": 1000, "initial_delay": delay, "max_delay": delay, "timeout": timeout}
    options = {"cache": {"dir": str(tmp_path / "cache"), "prefetch_threads": 2}, "retry": retry}
    return Dataset.from_path("p", f"memory://{root}", io_options=options)


def test_a_read_waiting_on_a_stopped_prefetch_retries_for_what_its_time_had_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store dead, two prefetches ran; the first to run out of retries stopped the other,
    and the read waiting on the stopped one's shard retried for a whole `timeout` again
    (5 s here, against 2.6 s before prefetches were stopped): one retry budget per object."""
    from zephon_torch.errors import StorageError

    read: list[float] = []

    def dead(name: str, thread: str) -> None:
        if thread != "zephon-prefetch":
            read.append(time.monotonic())
        raise ConnectionResetError("the store is down")

    dataset = _failing_downloads(monkeypatch, tmp_path, 4, dead, timeout=3)
    dataset.prefetch([0])
    time.sleep(0.1)
    dataset.prefetch([0, 1])  # shard 1's prefetch starts 0.1 s after shard 0's
    time.sleep(0.2)
    with pytest.raises(StorageError, match=r"part-1\.parquet: download failed after"):
        dataset.read_rows(1, [0])  # waits on shard 1's prefetch, which shard 0's stops
    assert 1 <= len(read) <= 3  # what shard 1 had left of its 3 s; a whole timeout: 6 tries


def test_a_stopped_prefetch_is_told_from_a_failed_one_by_its_error_not_the_breaker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read's download that succeeded between a prefetch's stop and its error handling
    cleared the breaker: the stopped prefetch was taken for a failed one, so the read waiting
    on its shard raised 'stopped' (the shard downloads fine) and prefetching stopped again."""
    from zephon_torch.errors import StorageError

    blip, in_flight = [True], threading.Event()

    def store(name: str, thread: str) -> None:
        if name == "part-1.parquet" and blip and thread == "zephon-prefetch":
            raise ConnectionResetError("a blip")
        if name == "part-2.parquet" and thread == "read 2":
            in_flight.wait(10)

    dataset = _failing_downloads(monkeypatch, tmp_path, 4, store, timeout=30)
    reader = dataset._reader
    got: dict[str, Any] = {}

    def read(shard: int) -> None:
        got[shard] = dataset.read_rows(shard, [0])[0]["n"]

    second = threading.Thread(target=read, args=(2,), name="read 2")
    second.start()  # its download held in flight
    dataset.prefetch([1])  # fails, then waits 0.5 s to retry
    time.sleep(0.1)
    first = threading.Thread(target=read, args=(1,), name="read 1")
    first.start()  # waits on the prefetch's lock
    time.sleep(0.1)
    with reader.downloads._lock:  # as a prefetch walk holds it
        reader.downloads._stop_prefetching(StorageError("another download failed", url="u"))
        time.sleep(0.2)  # the prefetch stopped, and waits for the lock
        blip.clear()
        in_flight.set()
        second.join(10)  # its download succeeded: prefetching resumes
    first.join(10)
    assert got == {2: 200, 1: 100}
    assert not reader.downloads._store_failed.is_set()
    dataset.prefetch([3])
    assert "3.parquet" in _cached_shards(tmp_path / "cache", 3)


def test_a_failed_download_ends_the_running_prefetches_waiting_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running prefetches, not only queued ones, stop: their wait before the next retry ends."""
    from zephon_torch.errors import StorageError

    tried: list[str] = []

    def dead(name: str, thread: str) -> None:
        tried.append(name)
        raise ConnectionResetError("the store is down")

    before = prefetch_threads()  # another test's may still be alive in this process
    dataset = _failing_downloads(monkeypatch, tmp_path, 2, dead, timeout=600, delay=60)
    dataset.prefetch([0, 1])  # both fail at once, then wait 60 s to retry
    deadline = time.monotonic() + 10
    while len(tried) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(tried) == ["part-0.parquet", "part-1.parquet"]
    with dataset._reader.downloads._lock:
        dataset._reader.downloads._stop_prefetching(
            StorageError("another download failed", url="u")
        )
    while prefetch_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not prefetch_threads() - before  # well before their 60 s wait
    assert len(tried) == 2
