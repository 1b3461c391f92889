"""The shard cache shared by several processes: each shard downloaded once within the limit,
name locks, a dead process's leftovers swept, no pin or lock kept by a forked child, evicters that
leave what another process holds, and a wait for a stalled download warned of."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import multiprocessing
import os
import threading
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    CHILD_S,
    cache_item,
    cache_writer,
    cached_files,
    until_ready_while_alive,
)
from zephon_torch.io import _pins
from zephon_torch.io._cache_folder import _LOCKS, _RESERVE, _TMP
from zephon_torch.io._locks import lock_file, release_file
from zephon_torch.io._shard_cache import CachedObject, ShardCache


def _fill(directory: str, seed: int) -> None:
    cache = ShardCache(directory, max_bytes=2500)
    order = list(range(12))
    order = order[seed:] + order[:seed]
    for number in order:
        content = hashlib.sha256(str(number).encode()).digest() * 16  # 512 bytes
        item = cache_item(f"{number}.bin", len(content))
        with cache.open(item, cache_writer(content, delay=0.005)) as path:
            assert Path(path).read_bytes() == content
            assert cache.used_bytes() <= 2500


def test_two_processes_filling_one_cache_stay_within_the_limit(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_fill, args=(str(tmp_path), seed)) for seed in (0, 0, 5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(CHILD_S)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    files = cached_files(tmp_path)
    assert 0 < sum(len(content) for content in files.values()) <= 2500
    for name, content in files.items():
        number = int(name.split("-", 1)[1].split(".")[0])
        assert content == hashlib.sha256(str(number).encode()).digest() * 16


def _bookkeeping(directory: Path) -> dict[str, list[str]]:
    return {sub: sorted(os.listdir(directory / sub)) for sub in (_LOCKS, _TMP, _RESERVE)}


def _fetch_all(directory: str, order: list[int], log: str) -> None:
    cache = ShardCache(directory, max_bytes=1 << 20)
    for number in order:
        content = str(number).encode() * 100

        def download(target: str, content: bytes = content, number: int = number) -> None:
            with open(log, "a") as handle:  # one short append per call: no interleaving
                handle.write(f"{number}\n")
            cache_writer(content, delay=0.02)(target)

        with cache.open(cache_item(f"{number}.bin", len(content)), download) as path:
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
        worker.join(CHILD_S)
    assert [worker.exitcode for worker in workers] == [0] * len(workers)
    assert sorted(log.read_text().split()) == [str(n) for n in range(6)]  # each exactly once
    assert _bookkeeping(tmp_path / "c") == {_LOCKS: [], _TMP: [], _RESERVE: []}


def _hold_a_download(directory: str, started: str) -> None:
    cache = ShardCache(directory, max_bytes=10_000)

    def download(target: str) -> None:
        Path(target).write_bytes(b"half")
        Path(started).touch()
        time.sleep(60)  # killed here, mid-download

    cache.ensure(cache_item("held.bin", 100), download, pin=False)


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
        assert until_ready_while_alive(started.exists, child)
        cache.ensure(
            cache_item("a.bin", 10), cache_writer(b"a" * 10), pin=False
        )  # sweeps: keeps the live
        live = _bookkeeping(directory)
        assert len(live[_TMP]) == len(live[_RESERVE]) == len(live[_LOCKS]) == 1
        assert live[_RESERVE][0].startswith("100-")
    finally:
        child.kill()
        child.join(10)
    cache.ensure(cache_item("b.bin", 10), cache_writer(b"b" * 10), pin=False)
    assert _bookkeeping(directory) == {_LOCKS: [], _TMP: [], _RESERVE: []}
    assert {name.split("-", 1)[1] for name in cached_files(directory)} == {"a.bin", "b.bin"}


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

    ShardCache(directory, max_bytes=1000).ensure(cache_item("n.bin", size), download, pin=False)


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
    until_ready_while_alive(started.exists, child)
    child.kill()
    child.join(10)
    assert started.exists()
    assert len(_bookkeeping(directory)[_RESERVE]) == 1
    cache = ShardCache(str(directory), max_bytes=1000, full_timeout=1)  # 600 + 600 > 1000
    path = cache.ensure(cache_item("n.bin", 600), cache_writer(b"y" * 600), pin=False)
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
        with cache.open(cache_item("a.bin", 100), cache_writer(b"a" * 100)):
            inside.set()
            leave.wait()

    reader = threading.Thread(target=read)
    reader.start()
    assert inside.wait(10)
    with _forked_worker():
        leave.set()
        reader.join(10)
        path = cache.ensure(
            cache_item("b.bin", 100), cache_writer(b"b" * 100), pin=False
        )  # evicts a
        assert Path(path).read_bytes() == b"b" * 100


def test_a_child_forked_between_a_pin_s_open_and_its_lock_does_not_keep_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that has opened a pin's descriptor but not yet locked and counted it when a
    worker forks: the child's copy must go too, or it would share the lock the parent's thread
    then takes, and keep that shard from eviction for the child's life."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    cache.ensure(cache_item("a.bin", 100), cache_writer(b"a" * 100), pin=False)
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
        with cache.open(cache_item("a.bin", 100), cache_writer(b"a" * 100)):
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
        path = cache.ensure(
            cache_item("b.bin", 100), cache_writer(b"b" * 100), pin=False
        )  # evicts a
        assert Path(path).read_bytes() == b"b" * 100
        assert not (tmp_path / "c" / CachedObject("s3://bucket/a.bin", 100, "v1").name).exists()


def test_a_child_unpinning_what_it_inherited_leaves_its_own_pins_alone(tmp_path: Path) -> None:
    """The forking thread's block ends in the child too: that unpin must not drop a pin the
    child took since, nor fail."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    item = cache_item("a.bin", 10)
    child = -1
    try:
        with cache.open(item, cache_writer(b"a" * 10)):
            child = os.fork()
            if child == 0:
                with cache.open(item, cache_writer(b"a" * 10)):  # the child's own pin
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


def _wait_for_space(directory: str, started: str) -> None:
    Path(started).touch()
    ShardCache(directory, max_bytes=150).ensure(
        cache_item("b.bin", 100), cache_writer(b"b" * 100), pin=False
    )


def test_the_lock_file_of_a_process_killed_waiting_for_space_is_swept(tmp_path: Path) -> None:
    directory, started = tmp_path / "c", tmp_path / "started"
    cache = ShardCache(str(directory), max_bytes=150)
    with cache.open(cache_item("a.bin", 100), cache_writer(b"a" * 100)):  # full of a shard in use
        child = multiprocessing.get_context("spawn").Process(
            target=_wait_for_space, args=(str(directory), str(started))
        )
        child.start()
        until_ready_while_alive(lambda: bool(os.listdir(directory / _LOCKS)), child)
        time.sleep(0.2)  # waiting in _reserve, holding b's lock
        child.kill()
        child.join(10)
    # b's lock, held while it waited; and a's too where it was killed inside an eviction's
    # probe of a (an evicter takes the name's lock, see `_evict`)
    left = sorted(name.split("-", 1)[1] for name in os.listdir(directory / _LOCKS))
    assert left in (["b.bin.lock"], ["a.bin.lock", "b.bin.lock"])
    cache.ensure(
        cache_item("c.bin", 10), cache_writer(b"c" * 10), pin=False
    )  # a reservation sweeps
    assert os.listdir(directory / _LOCKS) == []


def test_a_child_reading_a_shard_a_parent_thread_had_pinned_lets_its_own_pin_go(
    tmp_path: Path,
) -> None:
    cache = ShardCache(str(tmp_path / "c"), max_bytes=150, full_timeout=2)
    a = cache_item("a.bin", 100)
    inside, leave = threading.Event(), threading.Event()

    def read() -> None:
        with cache.open(a, cache_writer(b"a" * 100)):
            inside.set()
            leave.wait()

    reader = threading.Thread(target=read)
    reader.start()
    assert inside.wait(10)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # a worker: reads a, then lives on
        try:
            with cache.open(a, cache_writer(b"a" * 100)):
                pass
            os.write(w, b"1" if cache._pins.held == {} else b"0")
            time.sleep(6)
        finally:
            os._exit(0)
    try:
        assert os.read(r, 1) == b"1", "the child still holds its pin on a"
        leave.set()
        reader.join(10)
        path = cache.ensure(
            cache_item("b.bin", 100), cache_writer(b"b" * 100), pin=False
        )  # evicts a
        assert Path(path).read_bytes() == b"b" * 100
    finally:
        leave.set()
        os.kill(child, 9)
        os.waitpid(child, 0)


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
    old, newer = cache_item("old.jsonl", 100), cache_item("newer.jsonl", 100)
    cache.ensure(old, cache_writer(b"o" * 100), pin=False)
    time.sleep(0.01)
    cache.ensure(newer, cache_writer(b"n" * 100), pin=False)
    lock = cache._folder.name_lock(old.name)
    fd = lock_file(lock, wait=True)  # another process's download of `old`, under way
    assert fd is not None
    try:
        cache.ensure(cache_item("third.jsonl", 100), cache_writer(b"t" * 100), pin=False)
        assert {n.split("-", 1)[1] for n in cached_files(tmp_path)} == {"old.jsonl", "third.jsonl"}
    finally:
        release_file(lock, fd)
    cache._folder.evict_to_free(1 << 62)  # the disk's free space never reaches this
    assert cached_files(tmp_path) == {}


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
    item = cache_item("a.jsonl", 100)
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
        assert (
            Path(cache.ensure(item, cache_writer(b"x" * 100), pin=False)).read_bytes() == b"x" * 100
        )
    thread.join()
    notes = [str(w.message) for w in caught if "written nothing" in str(w.message)]
    if holder_writes:
        assert notes == []
    else:
        assert notes and item.name in notes[0] and "SIGSTOP" in notes[0]
