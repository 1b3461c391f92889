"""The node-local shard cache: LRU eviction, atomic downloads, pins, several processes."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest

from zephon_torch.errors import ConfigError, StorageError
from zephon_torch.io import Dataset, _pins
from zephon_torch.io._cache_folder import _LOCKS, _RESERVE, _TMP, CacheFolderError
from zephon_torch.io._locks import lock_file, release_file
from zephon_torch.io._shard_cache import CachedObject, ShardCache


def _item(name: str, size: int, version: str = "v1") -> CachedObject:
    return CachedObject(url=f"s3://bucket/{name}", size=size, version=version)


def _writer(content: bytes, delay: float = 0.0) -> Callable[[str], None]:
    def download(target: str) -> None:
        with open(target, "wb") as handle:
            half = len(content) // 2
            handle.write(content[:half])
            handle.flush()
            time.sleep(delay)
            handle.write(content[half:])

    return download


def _cached(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.startswith(".")}


def test_the_least_recently_used_shard_is_evicted_first(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=300)
    a, b, c = _item("a.jsonl", 100), _item("b.jsonl", 100), _item("c.jsonl", 100)
    for item in (a, b, c):
        cache.ensure(item, _writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    cache.ensure(a, _writer(b"never called"), pin=False)  # a is now the newest
    cache.ensure(_item("d.jsonl", 100), _writer(b"y" * 100), pin=False)
    names = {name.split("-", 1)[1] for name in _cached(tmp_path)}
    assert names == {"a.jsonl", "c.jsonl", "d.jsonl"}
    assert cache.used_bytes() <= 300


def test_files_the_cache_did_not_write_are_neither_counted_nor_evicted(tmp_path: Path) -> None:
    """A `dir` pointed at a folder in use: its files were evicted as least recently used."""
    (tmp_path / "checkpoint.pt").write_bytes(b"c" * 250)
    (tmp_path / "abc-notes.txt").write_bytes(b"n" * 250)
    cache = ShardCache(str(tmp_path), max_bytes=200)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        cache.ensure(_item(name, 100), _writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    assert {name.split("-", 1)[-1] for name in _cached(tmp_path)} == {
        "checkpoint.pt",
        "notes.txt",
        "b.jsonl",
        "c.jsonl",
    }
    assert cache.used_bytes() == 200


def test_a_shard_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=200, full_timeout=0.3)
    a, b = _item("a.jsonl", 100), _item("b.jsonl", 100)
    with cache.open(a, _writer(b"a" * 100)) as path_a, cache.open(b, _writer(b"b" * 100)):
        with pytest.raises(OSError, match="full of shards in use"):
            cache.ensure(_item("c.jsonl", 100), _writer(b"c" * 100), pin=False)
        assert Path(path_a).read_bytes() == b"a" * 100
    cache.ensure(_item("c.jsonl", 100), _writer(b"c" * 100), pin=False)
    assert cache.used_bytes() == 200


def test_no_partial_file_is_ever_visible(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    item = _item("slow.jsonl", 1000)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if os.path.exists(cache.path(item)):
                seen.append(os.path.getsize(cache.path(item)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    cache.ensure(item, _writer(b"z" * 1000, delay=0.2), pin=False)
    deadline = time.monotonic() + 5  # a loaded machine may not have run the watcher yet
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    watcher.join()
    assert seen and set(seen) == {1000}


def test_a_failed_or_short_download_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    with pytest.raises(OSError, match="expected 100"):
        cache.ensure(_item("a.jsonl", 100), _writer(b"short"), pin=False)
    assert _cached(tmp_path) == {}
    assert os.listdir(tmp_path / _TMP) == []
    assert os.listdir(tmp_path / _RESERVE) == []


def test_a_shard_larger_than_the_limit_is_an_error_naming_it(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10)
    with pytest.raises(ConfigError, match=r"s3://bucket/huge.parquet"):
        cache.ensure(_item("huge.parquet", 11), _writer(b"x" * 11), pin=False)


def _fill(directory: str, seed: int) -> None:
    cache = ShardCache(directory, max_bytes=2500)
    order = list(range(12))
    order = order[seed:] + order[:seed]
    for number in order:
        content = hashlib.sha256(str(number).encode()).digest() * 16  # 512 bytes
        item = _item(f"{number}.bin", len(content))
        with cache.open(item, _writer(content, delay=0.005)) as path:
            assert Path(path).read_bytes() == content
            assert cache.used_bytes() <= 2500


def test_two_processes_filling_one_cache_stay_within_the_limit(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_fill, args=(str(tmp_path), seed)) for seed in (0, 0, 5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    files = _cached(tmp_path)
    assert 0 < sum(len(content) for content in files.values()) <= 2500
    for name, content in files.items():
        number = int(name.split("-", 1)[1].split(".")[0])
        assert content == hashlib.sha256(str(number).encode()).digest() * 16


def test_a_changed_remote_object_is_downloaded_again(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/changing/a.jsonl", b'{"v": 1}\n')
    options = {"cache": {"dir": str(tmp_path / "c")}}
    first = Dataset.from_path("d", "memory:///changing", io_options=options)
    assert first.read_rows(0, [0]) == [{"v": 1}]
    time.sleep(0.01)
    fs.pipe("/changing/a.jsonl", b'{"v": 2}\n{"v": 3}\n')
    second = Dataset.from_path("d", "memory:///changing", io_options=options)
    assert second.read_rows(0, [0, 1]) == [{"v": 2}, {"v": 3}]
    assert len(_cached(tmp_path / "c")) == 2


def test_a_cached_copy_cut_short_is_downloaded_again_by_the_next_open(tmp_path: Path) -> None:
    """A copy cut short on the node's disk (a cleaner, a full disk, a crash) was pinned as it
    was: every read of every later job failed on it, blaming the remote object."""
    fs = fsspec.filesystem("memory")
    rows = [{"n": number, "text": f"row {number} " * 20} for number in range(50)]
    fs.pipe("/cut/a.jsonl", "".join(f"{json.dumps(row)}\n" for row in rows).encode())
    options = {"cache": {"dir": str(tmp_path / "c"), "prefetch_bytes": 0}}
    first = Dataset.from_path("d", "memory:///cut", io_options=options)
    assert first.read_rows(0, [49]) == [rows[49]]
    [name] = _cached(tmp_path / "c")
    copy = tmp_path / "c" / name
    os.truncate(copy, copy.stat().st_size // 2)
    later = Dataset.from_path("d", "memory:///cut", io_options=options)
    assert later.read_rows(0, [49, 0]) == [rows[49], rows[0]]
    assert _cached(tmp_path / "c") == {name: fs.cat("/cut/a.jsonl")}


def test_a_cut_short_copy_another_process_reads_is_an_error_naming_it(tmp_path: Path) -> None:
    """It cannot be deleted under that read, so it is named, not read as it is."""
    item = _item("a.jsonl", 100)
    reading = ShardCache(str(tmp_path), max_bytes=1000)  # another process's pins
    with reading.open(item, _writer(b"a" * 100)) as path:
        os.truncate(path, 40)
        cache = ShardCache(str(tmp_path), max_bytes=1000)
        with pytest.raises(StorageError, match=r"cached copy .*a\.jsonl' is 40 bytes, not the 100"):
            cache.ensure(item, _writer(b"b" * 100), pin=False)
    cache.ensure(item, _writer(b"b" * 100), pin=False)  # read no more: replaced
    assert Path(path).read_bytes() == b"b" * 100


def _bookkeeping(directory: Path) -> dict[str, list[str]]:
    return {sub: sorted(os.listdir(directory / sub)) for sub in (_LOCKS, _TMP, _RESERVE)}


def _fetch_all(directory: str, order: list[int], log: str) -> None:
    cache = ShardCache(directory, max_bytes=1 << 20)
    for number in order:
        content = str(number).encode() * 100

        def download(target: str, content: bytes = content, number: int = number) -> None:
            with open(log, "a") as handle:  # one short append per call: no interleaving
                handle.write(f"{number}\n")
            _writer(content, delay=0.02)(target)

        with cache.open(_item(f"{number}.bin", len(content)), download) as path:
            assert Path(path).read_bytes() == content


def test_processes_racing_for_the_same_shards_download_each_once_and_leave_no_lock_file(
    tmp_path: Path,
) -> None:
    """Name lock files are deleted by whoever lets them go; a process that was waiting on a
    deleted one must lock the current file, or two processes would download the same shard."""
    log = tmp_path / "downloads.log"
    log.touch()
    context = multiprocessing.get_context("spawn")
    orders = [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [2, 0, 4, 1, 5, 3], [0, 1, 2, 3, 4, 5]]
    workers = [
        context.Process(target=_fetch_all, args=(str(tmp_path / "c"), order, str(log)))
        for order in orders
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0] * len(workers)
    assert sorted(log.read_text().split()) == [str(n) for n in range(6)]  # each exactly once
    assert _bookkeeping(tmp_path / "c") == {_LOCKS: [], _TMP: [], _RESERVE: []}


def _hold_a_download(directory: str, started: str) -> None:
    cache = ShardCache(directory, max_bytes=10_000)

    def download(target: str) -> None:
        Path(target).write_bytes(b"half")
        Path(started).touch()
        time.sleep(60)  # killed here, mid-download

    cache.ensure(_item("held.bin", 100), download, pin=False)


def test_only_the_leftovers_of_a_dead_download_are_swept_whatever_their_pid(
    tmp_path: Path,
) -> None:
    """A download under way keeps its temporary file and reservation (it holds its name's
    lock); once its process is killed, the next reservation sweeps them."""
    directory = tmp_path / "c"
    cache = ShardCache(str(directory), max_bytes=10_000)
    started = tmp_path / "started"
    child = multiprocessing.get_context("spawn").Process(
        target=_hold_a_download, args=(str(directory), str(started))
    )
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists()
        cache.ensure(_item("a.bin", 10), _writer(b"a" * 10), pin=False)  # sweeps: keeps the live
        live = _bookkeeping(directory)
        assert len(live[_TMP]) == len(live[_RESERVE]) == len(live[_LOCKS]) == 1
        assert live[_RESERVE][0].startswith("100-")
    finally:
        child.kill()
        child.join(10)
    cache.ensure(_item("b.bin", 10), _writer(b"b" * 10), pin=False)
    assert _bookkeeping(directory) == {_LOCKS: [], _TMP: [], _RESERVE: []}
    assert {name.split("-", 1)[1] for name in _cached(directory)} == {"a.bin", "b.bin"}


def test_a_name_lock_excludes_its_holders_while_each_deletes_its_file_on_release(
    tmp_path: Path,
) -> None:
    """Threads lock like processes (each lock is its own open file). A waiter that opened the
    lock file before its holder deleted it must not count that file's lock as the lock."""
    path = str(tmp_path / "name.lock")
    inside: list[int] = []
    overlaps: list[int] = []

    def contend() -> None:
        for _ in range(300):
            fd = lock_file(path, wait=True)
            assert fd is not None
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            time.sleep(0.0001)
            inside.pop()
            release_file(path, fd)

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert not os.path.exists(path)


def _killed_mid_download(directory: str, size: int, started: str) -> None:
    def download(target: str) -> None:
        Path(target).write_bytes(b"x" * (size // 2))
        Path(started).touch()
        time.sleep(60)

    ShardCache(directory, max_bytes=1000).ensure(_item("n.bin", size), download, pin=False)


def test_a_restart_downloading_the_shard_its_killed_run_was_downloading_sweeps_that_run(
    tmp_path: Path,
) -> None:
    """The usual restart resumes at the shard it died on: holding that name's lock, it must
    take what lies under the name for a dead holder's, or count the dead reservation."""
    directory, started = tmp_path / "c", tmp_path / "started"
    child = multiprocessing.get_context("spawn").Process(
        target=_killed_mid_download, args=(str(directory), 600, str(started))
    )
    child.start()
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    child.kill()
    child.join(10)
    assert started.exists()
    assert len(_bookkeeping(directory)[_RESERVE]) == 1
    cache = ShardCache(str(directory), max_bytes=1000, full_timeout=1)  # 600 + 600 > 1000
    path = cache.ensure(_item("n.bin", 600), _writer(b"y" * 600), pin=False)
    assert Path(path).read_bytes() == b"y" * 600
    assert _bookkeeping(directory) == {_LOCKS: [], _TMP: [], _RESERVE: []}


def test_a_child_forked_while_a_thread_waits_for_a_lock_does_not_keep_that_lock(
    tmp_path: Path,
) -> None:
    """A thread still waiting for a lock file at a fork: the child must not keep a copy of it,
    or it would share the lock once the parent's thread gets it, and block later lockers."""
    path = str(tmp_path / "n.lock")
    holder = lock_file(path, wait=True)
    assert holder is not None
    got: dict[str, float] = {}

    def wait_for_it(tag: str) -> None:
        fd = lock_file(path, wait=True)
        assert fd is not None
        got[tag] = time.monotonic()
        release_file(path, fd)

    first = threading.Thread(target=wait_for_it, args=("first",))
    first.start()
    time.sleep(0.2)  # waiting in flock
    child = os.fork()
    if child == 0:  # a DataLoader worker, say: lives on for a while
        time.sleep(3)
        os._exit(0)
    try:
        second = threading.Thread(target=wait_for_it, args=("second",))
        second.start()
        time.sleep(0.2)  # waiting on the same file as the first
        released = time.monotonic()
        release_file(path, holder)
        first.join(10)
        second.join(10)
        assert set(got) == {"first", "second"}
        assert max(got.values()) - released < 2.5  # not held until the child exits
    finally:
        os.waitpid(child, 0)


@contextlib.contextmanager
def _forked_worker() -> Iterator[None]:
    """Forks a child that lives on for a while, as a DataLoader worker does, and ends it."""
    child = os.fork()
    if child == 0:
        time.sleep(6)
        os._exit(0)
    try:
        yield
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_a_child_forked_while_a_thread_reads_a_shard_does_not_keep_it_pinned(
    tmp_path: Path,
) -> None:
    """A DataLoader worker forked while a runner or prefetch thread has a shard pinned must not
    keep that pin for its life: the parent's read ends, and the shard must be evictable."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    inside, leave = threading.Event(), threading.Event()

    def read() -> None:
        with cache.open(_item("a.bin", 100), _writer(b"a" * 100)):
            inside.set()
            leave.wait()

    reader = threading.Thread(target=read)
    reader.start()
    assert inside.wait(10)
    with _forked_worker():
        leave.set()
        reader.join(10)
        path = cache.ensure(_item("b.bin", 100), _writer(b"b" * 100), pin=False)  # evicts a
        assert Path(path).read_bytes() == b"b" * 100


def test_a_child_forked_between_a_pin_s_open_and_its_lock_does_not_keep_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that has opened a pin's descriptor but not yet locked and counted it when a
    worker forks: the child's copy must go too, or it would share the lock the parent's thread
    then takes, and keep that shard from eviction for the child's life."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    cache.ensure(_item("a.bin", 100), _writer(b"a" * 100), pin=False)
    opened, go, inside, leave = (threading.Event() for _ in range(4))
    real = fcntl.flock

    def paused_flock(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_SH and threading.current_thread() is reader:
            opened.set()  # the pin's descriptor is open: hold the thread here over the fork
            go.wait(10)
        real(fd, operation)

    monkeypatch.setattr(
        _pins, "fcntl", types.SimpleNamespace(flock=paused_flock, LOCK_SH=fcntl.LOCK_SH)
    )

    def read() -> None:
        with cache.open(_item("a.bin", 100), _writer(b"a" * 100)):
            inside.set()
            leave.wait(10)

    reader = threading.Thread(target=read)
    reader.start()
    assert opened.wait(10)
    with _forked_worker():
        go.set()
        assert inside.wait(10)
        leave.set()
        reader.join(10)
        path = cache.ensure(_item("b.bin", 100), _writer(b"b" * 100), pin=False)  # evicts a
        assert Path(path).read_bytes() == b"b" * 100
        assert not (tmp_path / "c" / CachedObject("s3://bucket/a.bin", 100, "v1").name).exists()


def test_a_child_unpinning_what_it_inherited_leaves_its_own_pins_alone(tmp_path: Path) -> None:
    """The forking thread's block ends in the child too: that unpin must not drop a pin the
    child took since, nor fail."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    item = _item("a.bin", 10)
    child = -1
    try:
        with cache.open(item, _writer(b"a" * 10)):
            child = os.fork()
            if child == 0:
                with cache.open(item, _writer(b"a" * 10)):  # the child's own pin
                    pass
        if child == 0:  # the forking block ended in the child: every unpin balanced
            os._exit(0 if cache._pins.held == {} and cache._pins.owed == {} else 2)
    except BaseException:
        if child == 0:
            os._exit(3)
        raise
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache._pins.held == {}


def test_a_shard_with_a_long_basename_is_cached(tmp_path: Path) -> None:
    """Object keys may be 1024 bytes: the name, its temporary file and its reservation must
    stay under NAME_MAX, keeping the extension readers go by."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    base = "x" * 240 + ".jsonl.zst"
    path = cache.ensure(_item(base, 10), _writer(b"0123456789"), pin=False)
    assert Path(path).read_bytes() == b"0123456789"
    assert path.endswith(".jsonl.zst") and len(os.path.basename(path)) < 200
    made = f"{tmp_path}/{base} (decompressed)"
    with cache.open_made("k", made, lambda target: Path(target).write_bytes(b"m")) as local:
        assert Path(local).read_bytes() == b"m"


def _wait_for_space(directory: str, started: str) -> None:
    Path(started).touch()
    ShardCache(directory, max_bytes=150).ensure(_item("b.bin", 100), _writer(b"b" * 100), pin=False)


def test_the_lock_file_of_a_process_killed_waiting_for_space_is_swept(tmp_path: Path) -> None:
    directory, started = tmp_path / "c", tmp_path / "started"
    cache = ShardCache(str(directory), max_bytes=150)
    with cache.open(_item("a.bin", 100), _writer(b"a" * 100)):  # full of a shard in use
        child = multiprocessing.get_context("spawn").Process(
            target=_wait_for_space, args=(str(directory), str(started))
        )
        child.start()
        deadline = time.monotonic() + 30
        while not os.listdir(directory / _LOCKS) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # waiting in _reserve, holding b's lock
        child.kill()
        child.join(10)
    # b's lock, held while it waited; and a's too where it was killed inside an eviction's
    # probe of a (an evicter takes the name's lock, see `_evict`)
    left = sorted(name.split("-", 1)[1] for name in os.listdir(directory / _LOCKS))
    assert left in (["b.bin.lock"], ["a.bin.lock", "b.bin.lock"])
    cache.ensure(_item("c.bin", 10), _writer(b"c" * 10), pin=False)  # a reservation sweeps
    assert os.listdir(directory / _LOCKS) == []


def test_a_child_reading_a_shard_a_parent_thread_had_pinned_lets_its_own_pin_go(
    tmp_path: Path,
) -> None:
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    a = _item("a.bin", 100)
    inside, leave = threading.Event(), threading.Event()

    def read() -> None:
        with cache.open(a, _writer(b"a" * 100)):
            inside.set()
            leave.wait()

    reader = threading.Thread(target=read)
    reader.start()
    assert inside.wait(10)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # a worker: reads a, then lives on
        try:
            with cache.open(a, _writer(b"a" * 100)):
                pass
            os.write(w, b"1" if cache._pins.held == {} else b"0")
            time.sleep(6)
        finally:
            os._exit(0)
    try:
        assert os.read(r, 1) == b"1", "the child still holds its pin on a"
        leave.set()
        reader.join(10)
        path = cache.ensure(_item("b.bin", 100), _writer(b"b" * 100), pin=False)  # evicts a
        assert Path(path).read_bytes() == b"b" * 100
    finally:
        leave.set()
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_a_shard_with_a_long_non_ascii_basename_is_cached(tmp_path: Path) -> None:
    """NAME_MAX is 255 bytes, not characters: 100 CJK characters are 300 bytes."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    base = "语料" * 60 + ".jsonl.zst"
    item = CachedObject(url=f"s3://bucket/{base}", size=10, version="v1")
    path = cache.ensure(item, lambda target: Path(target).write_bytes(b"0123456789"), pin=False)
    assert Path(path).read_bytes() == b"0123456789"
    assert path.endswith(".jsonl.zst")
    made = f"{tmp_path}/{base} (decompressed)"
    with cache.open_made("k", made, lambda target: Path(target).write_bytes(b"m")) as local:
        assert Path(local).read_bytes() == b"m"


@pytest.mark.parametrize("base", ["a\0b.jsonl", "a\ud800b.jsonl"])
def test_a_shard_whose_name_no_file_name_can_hold_is_cached(tmp_path: Path, base: str) -> None:
    """An object named with a NUL (or a lone surrogate, as a JSON index may name a shard)
    failed with a bare "ValueError: embedded null byte" (a UnicodeEncodeError) at the first
    use of its cached file, whatever the format."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    item = CachedObject(url=f"memory://bucket/{base}", size=10, version="v1")
    path = cache.ensure(item, lambda target: Path(target).write_bytes(b"0123456789"), pin=False)
    assert Path(path).read_bytes() == b"0123456789" and path.endswith("a?b.jsonl")
    assert cache.touch(item)
    other = CachedObject(url="memory://bucket/a?b.jsonl", size=10, version="v1")
    assert cache.path(other) != path  # told apart by the digest of the whole URL


def test_a_cache_folder_deleted_during_a_run_is_made_again(tmp_path: Path) -> None:
    """A tmp cleaner (or `rm -rf ~/.cache`) removed the folder: every later download failed
    with a bare FileNotFoundError on a lock file, and an npy read blamed the data."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    cache.ensure(_item("a.jsonl", 10), _writer(b"a" * 10), pin=False)
    shutil.rmtree(tmp_path / "cache")
    with cache.open(_item("b.jsonl", 10), _writer(b"b" * 10)) as path:
        assert Path(path).read_bytes() == b"b" * 10
    with cache.open(_item("a.jsonl", 10), _writer(b"a" * 10)) as path:  # downloaded again
        assert Path(path).read_bytes() == b"a" * 10
    assert cache.misses == 3


def test_a_cache_folder_deleted_during_a_download_is_made_again_for_one_more(
    tmp_path: Path,
) -> None:
    """Deleted while a download ran: the bare FileNotFoundError of the folder's lock file,
    raised from the cleanup, hid the download's own error (which a remote reader took for
    the object gone from the store)."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    calls = []

    def download(target: str) -> None:
        calls.append(target)
        if len(calls) == 1:
            shutil.rmtree(tmp_path / "cache")  # a cleaner, mid-download
        Path(target).write_bytes(b"x" * 10)

    path = cache.ensure(_item("a.jsonl", 10), download, pin=False)
    assert Path(path).read_bytes() == b"x" * 10 and len(calls) == 2

    def always(target: str) -> None:  # every try loses its folder
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        Path(target).write_bytes(b"y" * 10)

    # it was the bare FileNotFoundError of a temporary file, naming no URL
    with pytest.raises(CacheFolderError, match=r"'s3://bucket/b\.jsonl'") as caught:
        cache.ensure(_item("b.jsonl", 10), always, pin=False)
    assert f"{str(tmp_path / 'cache')!r} (io_options cache `dir`)" in str(caught.value)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_a_cache_folder_made_again_by_another_process_mid_download_is_made_again_for_one_more(
    tmp_path: Path,
) -> None:
    """Deleted while a download ran and made again at once by another process sharing it:
    the download's FileNotFoundError was raised as it was, the folder being there again."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    calls = []

    def download(target: str) -> None:
        calls.append(target)
        with open(target, "wb") as handle:
            if len(calls) == 1:  # the file written is deleted with its folder
                shutil.rmtree(tmp_path / "cache")
                ShardCache(str(tmp_path / "cache"), max_bytes=1000)  # the other process's
            handle.write(b"x" * 10)

    path = cache.ensure(_item("a.jsonl", 10), download, pin=False)
    assert Path(path).read_bytes() == b"x" * 10 and len(calls) == 2


@contextlib.contextmanager
def _unwritable(folder: Path) -> Iterator[None]:
    """``folder`` made unwritable: `chattr +i` for root (whom a mode does not bind)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None:
        pytest.skip("no chattr to make a folder unwritable for root")
    made = subprocess.run(["chattr", "+i", str(folder)], check=False, capture_output=True)
    if made.returncode:
        pytest.skip(f"chattr +i is refused on {folder}'s file system")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_cache_folder_that_cannot_be_written_is_a_config_error_naming_it(
    tmp_path: Path,
) -> None:
    """Its bookkeeping folders writable, the folder itself not: downloads landed in
    `.downloading`, then a bare PermissionError came from moving them into the folder."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    with (
        _unwritable(tmp_path / "cache"),
        pytest.raises(ConfigError, match=r"shard cache folder .*cache.* cannot be written"),
    ):
        cache.ensure(_item("a.jsonl", 10), _writer(b"x" * 10), pin=False)


def test_a_cache_folder_that_cannot_be_made_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"shard cache folder .*afile/cache.* Not a directory"):
        ShardCache(str(tmp_path / "afile" / "cache"), max_bytes=1000)


def test_an_evicter_never_deletes_a_newer_file_placed_under_the_name_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the evicter's open and its lock, the old file went (a discard) and a new
    download was placed under the name, pinned: the evicter locked the old file's inode, which
    no one holds, and unlinked the path, the new, pinned file."""
    from zephon_torch.io import _cache_folder

    path = tmp_path / "shard"
    path.write_bytes(b"old")
    newer = tmp_path / "newer"
    newer.write_bytes(b"new download")
    pinned: list[int] = []
    real_flock = fcntl.flock

    def replaced_before_the_lock(fd: int, operation: int) -> None:
        if not pinned:
            os.replace(newer, path)  # the discard and the new download's placing, at once
            pinned.append(os.open(path, os.O_RDONLY))
            real_flock(pinned[0], fcntl.LOCK_SH)  # the new file's reader's pin
        real_flock(fd, operation)

    monkeypatch.setattr(_cache_folder.fcntl, "flock", replaced_before_the_lock)
    try:
        assert _cache_folder.delete_unpinned(str(path)) is False
        assert path.read_bytes() == b"new download"
    finally:
        os.close(pinned[0])


def test_an_evicter_leaves_a_file_whose_name_another_process_holds_locked(tmp_path: Path) -> None:
    """A process holding a name's lock may be placing a new download under it: the evicter
    leaves that name's file (its inode check and its unlink are not one step), and evicts it
    once the lock is let go."""
    cache = ShardCache(str(tmp_path), max_bytes=200)
    old, newer = _item("old.jsonl", 100), _item("newer.jsonl", 100)
    cache.ensure(old, _writer(b"o" * 100), pin=False)
    time.sleep(0.01)
    cache.ensure(newer, _writer(b"n" * 100), pin=False)
    lock = cache._folder.name_lock(old.name)
    fd = lock_file(lock, wait=True)  # another process's download of `old`, under way
    assert fd is not None
    try:
        cache.ensure(_item("third.jsonl", 100), _writer(b"t" * 100), pin=False)
        assert {n.split("-", 1)[1] for n in _cached(tmp_path)} == {"old.jsonl", "third.jsonl"}
    finally:
        release_file(lock, fd)
    cache._folder.evict_to_free(1 << 62)  # the disk's free space never reaches this
    assert _cached(tmp_path) == {}


@pytest.mark.parametrize("holder_writes", [False, True])
def test_a_wait_for_a_download_that_writes_nothing_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder_writes: bool
) -> None:
    """A process holding a shard's download while stopped (SIGSTOP, `docker pause`) kept
    every other process waiting for that shard in silence. A holder writing its temporary
    file is waited for without a word."""
    from zephon_torch.io import _cache_folder

    monkeypatch.setattr(_cache_folder, "STALL_S", 0.3)
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    item = _item("a.jsonl", 100)
    lock = cache._folder.name_lock(item.name)
    fd = lock_file(lock, wait=True)  # the other process's download of the shard
    assert fd is not None
    partial = Path(cache._folder.temp(item.name))
    partial.write_bytes(b"p")

    def holder() -> None:
        for _ in range(15):
            time.sleep(0.1)
            if holder_writes:
                with partial.open("ab") as out:
                    out.write(b"p")
        partial.unlink()
        release_file(lock, fd)  # it died before placing the file: the waiter downloads it

    thread = threading.Thread(target=holder)
    thread.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Path(cache.ensure(item, _writer(b"x" * 100), pin=False)).read_bytes() == b"x" * 100
    thread.join()
    notes = [str(w.message) for w in caught if "written nothing" in str(w.message)]
    if holder_writes:
        assert notes == []
    else:
        assert notes and item.name in notes[0] and "SIGSTOP" in notes[0]
