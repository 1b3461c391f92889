"""The shard cache's ledger: reservations that fit list no folder, and the ledger never lets
the cache count too little (a dead process's file, a ledger cut short, a cleaner's deletions)."""

from __future__ import annotations

import errno
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zephon_torch.io._cache_folder as folder_module
from tests.helpers import cache_item, cache_writer
from zephon_torch.io._cache_folder import CacheFolder
from zephon_torch.io._cache_ledger import LEDGER, add_to_ledger, read_ledger, write_ledger
from zephon_torch.io._cache_names import cached_name
from zephon_torch.io._shard_cache import ShardCache


def _fill(directory: Path, files: int, size: int) -> None:
    """`files` cached files of `size` bytes, as earlier runs would have left them, oldest first."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for i in range(files):
        path = directory / cached_name(f"old-{i}", f"s3://bucket/old-{i}.bin")
        path.write_bytes(b"o" * size)
        os.utime(path, (now - files + i, now - files + i))


def _cached_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if not p.name.startswith("."))


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    listing = CacheFolder.entries

    def counted(self: CacheFolder) -> list[tuple[str, int, float]]:
        calls.append(1)
        return listing(self)

    monkeypatch.setattr(CacheFolder, "entries", counted)
    return calls


def test_shards_that_fit_are_placed_without_listing_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reservation listed the whole folder (40 ms with 10,000 files, under the node-wide
    lock); now only the first, which finds no ledger."""
    _fill(tmp_path, 500, 10)
    calls = _count_listings(monkeypatch)
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    for i in range(100):
        cache.ensure(cache_item(f"new-{i}.bin", 10), cache_writer(b"x" * 10), pin=False)
    assert len(calls) == 1
    assert _cached_bytes(tmp_path) == 6000


def test_a_full_cache_of_many_files_lists_its_folder_once_per_margin_not_per_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1,000 files of 10 bytes and room for no more, an eviction frees 1/32 of the
    limit (312 bytes) past what the shard needs: 32 more shards fit before the next listing."""
    _fill(tmp_path, 1000, 10)
    calls = _count_listings(monkeypatch)
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    for i in range(100):
        cache.ensure(cache_item(f"new-{i}.bin", 10), cache_writer(b"x" * 10), pin=False)
        assert _cached_bytes(tmp_path) <= 10_000
    assert len(calls) == 4  # shards 0, 33, 66 and 99
    assert _cached_bytes(tmp_path) == 10_000 - 330 + 10  # 33 evicted, one placed
    names = {p.name.split("-", 1)[1] for p in tmp_path.iterdir() if not p.name.startswith(".")}
    assert {f"new-{i}.bin" for i in range(100)} <= names  # the oldest went, never the new


def test_a_ledger_counting_too_little_is_set_right_by_every_rescan_every_th_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files placed by a writer that keeps no ledger (a version before it) are not in the
    ledger, so reservations that fit by it list nothing and the cache goes past its limit:
    the listing every `_RESCAN_EVERY`-th reservation counts them and evicts back to it."""
    monkeypatch.setattr(folder_module, "_RESCAN_EVERY", 4)
    calls = _count_listings(monkeypatch)
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    cache.ensure(cache_item("new-0.bin", 100), cache_writer(b"x" * 100), pin=False)
    assert len(calls) == 1  # no ledger yet: listed
    _fill(tmp_path, 9, 100)  # behind the ledger's back: 1,000 bytes, the ledger says 100
    for i in range(1, 4):  # the ledger says they fit, and is not due
        cache.ensure(cache_item(f"new-{i}.bin", 100), cache_writer(b"x" * 100), pin=False)
    assert len(calls) == 1
    assert _cached_bytes(tmp_path) == 1300
    cache.ensure(cache_item("new-4.bin", 100), cache_writer(b"x" * 100), pin=False)
    assert len(calls) == 2  # the fourth since the listing: listed, and evicted
    assert _cached_bytes(tmp_path) == 1000
    names = {p.name.split("-", 1)[1] for p in tmp_path.iterdir() if not p.name.startswith(".")}
    assert names == {f"new-{i}.bin" for i in range(5)} | {f"old-{i}.bin" for i in range(4, 9)}
    _more_stay_within_the_limit(cache, tmp_path)


def test_reservations_and_their_ledger_writes_leave_no_descriptor_open(tmp_path: Path) -> None:
    """Each reservation and release writes the ledger: a descriptor left open by each write
    would run a long run's process out of them (EMFILE) after about a thousand shards."""
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    cache.ensure(cache_item("first.bin", 10), cache_writer(b"x" * 10), pin=False)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(50):
        cache.ensure(cache_item(f"new-{i}.bin", 10), cache_writer(b"x" * 10), pin=False)
    assert len(os.listdir("/proc/self/fd")) < before + 10  # not one (or two) a shard


def test_a_ledger_that_cannot_be_written_is_deleted_not_left_counting_too_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk, no descriptor left) before it truncated the ledger
    would leave the old total, smaller than the new one: the ledger goes, and the next
    reservation lists the folder."""
    write_ledger(str(tmp_path), 100, 3)
    assert read_ledger(str(tmp_path)) == (100, 3)
    real_open = os.open

    def failing(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(path) == LEDGER:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    add_to_ledger(str(tmp_path), 50)
    monkeypatch.setattr(os, "open", real_open)
    assert read_ledger(str(tmp_path)) is None
    assert not (tmp_path / LEDGER).exists()


def test_a_file_whose_process_died_before_releasing_its_reservation_is_counted(
    tmp_path: Path,
) -> None:
    """A process killed between placing a shard and releasing its reservation never adds the
    shard to the ledger; the sweep of its reservation must, or the cache would count too
    little and grow past its limit without ever listing its folder."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    # a ledger now exists
    cache.ensure(cache_item("first.bin", 100), cache_writer(b"x" * 100), pin=False)
    pid = os.fork()
    if pid == 0:  # killed right after the shard is placed, holding its reservation
        try:
            CacheFolder.release = lambda *_, **__: os._exit(0)  # type: ignore[method-assign]
            ShardCache(str(tmp_path), max_bytes=1000).ensure(
                cache_item("dead.bin", 500), cache_writer(b"x" * 500), pin=False
            )
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _cached_bytes(tmp_path) == 600
    _more_stay_within_the_limit(cache, tmp_path)


@pytest.mark.parametrize("ledger", [b"", b"12", b"100 3", b"x y\n", b"-5 0\n"])
def test_a_ledger_cut_short_or_unreadable_has_the_folder_listed(
    tmp_path: Path, ledger: bytes
) -> None:
    """A crash mid-write leaves part of the ledger ("100 3" of "100 37\\n"): it is not read,
    and the next reservation counts the files themselves."""
    cache = ShardCache(str(tmp_path), max_bytes=300)
    for name in ("a.bin", "b.bin", "c.bin"):
        cache.ensure(cache_item(name, 100), cache_writer(b"x" * 100), pin=False)
    (tmp_path / LEDGER).write_bytes(ledger)
    cache.ensure(cache_item("d.bin", 100), cache_writer(b"x" * 100), pin=False)
    assert _cached_bytes(tmp_path) == 300


def test_a_ledger_counting_files_a_cleaner_deleted_evicts_nothing_more(tmp_path: Path) -> None:
    """A ledger may count too much; the listing it leads to sets it right before evicting."""
    cache = ShardCache(str(tmp_path), max_bytes=300)
    for name in ("a.bin", "b.bin", "c.bin"):
        cache.ensure(cache_item(name, 100), cache_writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    for path in tmp_path.iterdir():
        if path.name.endswith(("-a.bin", "-b.bin")):
            path.unlink()  # a cleaner's work: the ledger still says 300
    cache.ensure(cache_item("d.bin", 100), cache_writer(b"x" * 100), pin=False)
    names = {p.name.split("-", 1)[1] for p in tmp_path.iterdir() if not p.name.startswith(".")}
    assert names == {"c.bin", "d.bin"}


def test_the_limit_holds_through_random_cleaners_deaths_and_ledger_damage(
    tmp_path: Path,
) -> None:
    """Shards of random sizes through two caches on one folder, with files deleted behind
    their backs, ledgers deleted or cut short, and processes dying before they release: the
    folder never holds more than the limit, and every shard asked for is there whole."""
    rng = random.Random(7)
    limit = 2_000
    caches = [ShardCache(str(tmp_path), max_bytes=limit) for _ in range(2)]
    for step in range(150):
        action = rng.random()
        if action < 0.05:
            (tmp_path / LEDGER).unlink(missing_ok=True)
        elif action < 0.1:
            (tmp_path / LEDGER).write_bytes(b"1")
        elif action < 0.15:
            cached = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
            if cached:
                rng.choice(cached).unlink()
        elif action < 0.2:
            pid = os.fork()
            if pid == 0:
                try:
                    CacheFolder.release = lambda *_, **__: os._exit(0)  # type: ignore[method-assign]
                    ShardCache(str(tmp_path), max_bytes=limit).ensure(
                        cache_item(f"dead-{step}.bin", 300), cache_writer(b"x" * 300), pin=False
                    )
                finally:
                    os._exit(1)
            os.waitpid(pid, 0)
        size = rng.randint(1, 400)
        item = cache_item(f"shard-{step}.bin", size)
        path = rng.choice(caches).ensure(item, cache_writer(b"x" * size), pin=False)
        assert os.path.getsize(path) == size
        assert _cached_bytes(tmp_path) <= limit, f"over the limit at step {step}"


def _die_in_child(body: Callable[[], None]) -> None:
    """Runs `body` in a forked child, which is to die in it (`os._exit(0)`, as SIGKILL would)."""
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_process_killed_as_it_releases_its_placed_file_leaves_it_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed inside `release`, after its reservation's marker is deleted and before the
    ledger is written: the placed file is counted nowhere (no marker left to sweep), and the
    cache grows past its limit without listing its folder."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    # a ledger now exists
    cache.ensure(cache_item("first.bin", 100), cache_writer(b"x" * 100), pin=False)

    def killed_in_release() -> None:
        monkeypatch.setattr(folder_module, "add_to_ledger", lambda *_: os._exit(0))
        ShardCache(str(tmp_path), max_bytes=1000).ensure(
            cache_item("dead.bin", 500), cache_writer(b"x" * 500), pin=False
        )

    _die_in_child(killed_in_release)
    assert _cached_bytes(tmp_path) == 600
    _more_stay_within_the_limit(cache, tmp_path)


def test_a_reservation_killed_after_sweeping_a_dead_one_leaves_its_file_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process died after placing its file, before releasing; the next reservation sweeps
    its marker, and is itself killed before it writes the ledger: the swept bytes (the dead
    process's file) must not be lost with it."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    cache.ensure(cache_item("first.bin", 100), cache_writer(b"x" * 100), pin=False)

    def killed_before_release() -> None:
        CacheFolder.release = lambda *_, **__: os._exit(0)  # type: ignore[method-assign]
        ShardCache(str(tmp_path), max_bytes=1000).ensure(
            cache_item("dead.bin", 500), cache_writer(b"x" * 500), pin=False
        )

    def killed_after_sweeping() -> None:
        monkeypatch.setattr(folder_module, "read_ledger", lambda *_: os._exit(0))
        ShardCache(str(tmp_path), max_bytes=1000).ensure(
            cache_item("sweeper.bin", 100), cache_writer(b"x" * 100), pin=False
        )

    _die_in_child(killed_before_release)
    _die_in_child(killed_after_sweeping)
    assert not os.listdir(tmp_path / ".reserved")  # swept
    assert _cached_bytes(tmp_path) == 600
    _more_stay_within_the_limit(cache, tmp_path)


def test_a_placed_file_whose_marker_a_cleaner_deleted_is_counted(tmp_path: Path) -> None:
    """A cleaner deletes the download's reservation marker (an old empty file) while the
    download runs: the release then finds no marker to delete, and must count the placed
    file all the same."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    cache.ensure(cache_item("first.bin", 100), cache_writer(b"x" * 100), pin=False)

    def download(target: str) -> None:
        for marker in (tmp_path / ".reserved").iterdir():
            marker.unlink()  # the cleaner's work, during the download
        Path(target).write_bytes(b"x" * 500)

    cache.ensure(cache_item("slow.bin", 500), download, pin=False)
    assert _cached_bytes(tmp_path) == 600
    _more_stay_within_the_limit(cache, tmp_path)


def test_a_listing_due_evicts_nothing_when_the_shard_fits(tmp_path: Path) -> None:
    """The margin is for evictions: a reservation that fits, listing only because the ledger
    is due (or missing), evicted shards down to 31/32 of the limit all the same."""
    _fill(tmp_path, 100, 10)  # 1,000 bytes of 1,010
    cache = ShardCache(str(tmp_path), max_bytes=1010)
    cache.ensure(cache_item("new.bin", 10), cache_writer(b"x" * 10), pin=False)
    assert _cached_bytes(tmp_path) == 1010  # nothing evicted: it fits


def test_a_file_placed_in_the_folder_made_again_under_its_download_is_counted(
    tmp_path: Path,
) -> None:
    """A cleaner deletes the whole folder during a download; another process makes it again
    and places a shard (a new ledger, from a listing), and the download then writes its
    temporary file in the new folder and places it there: its reservation's marker went with
    the old folder, and the file must be counted all the same."""
    import shutil

    cache = ShardCache(str(tmp_path), max_bytes=1000)
    cache.ensure(cache_item("first.bin", 100), cache_writer(b"x" * 100), pin=False)

    def download(target: str) -> None:
        shutil.rmtree(tmp_path)  # the cleaner
        other = ShardCache(str(tmp_path), max_bytes=1000)  # makes the folder again
        other.ensure(cache_item("other.bin", 100), cache_writer(b"x" * 100), pin=False)
        Path(target).write_bytes(b"x" * 500)

    cache.ensure(cache_item("slow.bin", 500), download, pin=False)
    assert _cached_bytes(tmp_path) == 600
    _more_stay_within_the_limit(cache, tmp_path)


@pytest.mark.xfail(
    strict=True,
    reason="a version before the ledger places files it never adds to it; the cache stays "
    "over its limit until the next listing, up to 1,024 reservations later",
)
def test_files_placed_by_a_version_before_the_ledger_are_counted(tmp_path: Path) -> None:
    """A job of the version before the ledger (ae8ec7e) on the same node, sharing the folder:
    its release deletes the marker and adds nothing to the ledger (its reservations list the
    folder and keep the limit themselves)."""
    import contextlib
    import fcntl

    from zephon_torch.io._locks import flock

    cache = ShardCache(str(tmp_path), max_bytes=1000)
    for i in range(2):
        cache.ensure(cache_item(f"new-{i}.bin", 100), cache_writer(b"x" * 100), pin=False)

    def old_release(self: CacheFolder, marker: str, **_: object) -> None:  # ae8ec7e's
        with contextlib.suppress(OSError), flock(self._lock, fcntl.LOCK_EX):
            os.unlink(marker)

    def old_job() -> None:
        CacheFolder.release = old_release  # type: ignore[method-assign]
        old = ShardCache(str(tmp_path), max_bytes=1000)
        for i in range(8):
            old.ensure(cache_item(f"old-{i}.bin", 100), cache_writer(b"x" * 100), pin=False)
        os._exit(0)

    _die_in_child(old_job)
    assert _cached_bytes(tmp_path) == 1000
    for i in range(2, 10):
        cache.ensure(cache_item(f"new-{i}.bin", 100), cache_writer(b"x" * 100), pin=False)
        assert _cached_bytes(tmp_path) <= 1000


def _more_stay_within_the_limit(cache: ShardCache, folder: Path) -> None:
    """Eight more shards of 100 bytes keep ``folder`` within its 1,000-byte limit."""
    for i in range(8):
        cache.ensure(cache_item(f"more-{i}.bin", 100), cache_writer(b"x" * 100), pin=False)
        assert _cached_bytes(folder) <= 1000
