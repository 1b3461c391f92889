"""The shard cache on a disk that fills before `max_bytes` (64 GiB by default, more than many
nodes have free): unpinned shards are evicted to make room, else a ConfigError names the folder
and the limit. The disk is a real 64 KiB tmpfs, which only root can mount: skipped elsewhere."""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io._cache_folder import CacheFolder
from zephon_torch.io._shard_cache import _DISK_FULL_TRIES, CachedObject, ShardCache
from zephon_torch.io.jsonl import JsonlReader

_SHARD = 25_000  # two fit on the disk, a third does not


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at a fresh folder."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:  # root without CAP_SYS_ADMIN (a container)
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _item(name: str) -> CachedObject:
    return CachedObject(url=f"s3://bucket/{name}", size=_SHARD, version="v1")


def _download(target: str) -> None:
    with open(target, "wb") as handle:
        handle.write(b"x" * _SHARD)


def test_a_full_disk_evicts_unpinned_shards_to_make_room(small_disk: Path) -> None:
    """ENOSPC was retried as a transient store failure, then raised as a StorageError blaming
    the remote URL, while the cache held shards it could evict."""
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    cache.ensure(_item("a.parquet"), _download, pin=False)
    cache.ensure(_item("b.parquet"), _download, pin=False)
    os.utime(cache.path(_item("a.parquet")), (1, 1))  # the least recently used
    path = cache.ensure(_item("c.parquet"), _download, pin=False)
    assert os.path.getsize(path) == _SHARD
    assert not os.path.exists(cache.path(_item("a.parquet")))
    assert os.path.exists(cache.path(_item("b.parquet")))


def test_a_disk_full_of_shards_in_use_is_a_config_error_naming_the_folder_and_limit(
    small_disk: Path,
) -> None:
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    with (
        cache.open(_item("a.parquet"), _download),
        cache.open(_item("b.parquet"), _download),
        pytest.raises(ConfigError, match=r"disk of the shard cache folder .*max_bytes") as caught,
    ):
        cache.ensure(_item("c.parquet"), _download, pin=False)
    assert str(small_disk / "cache") in str(caught.value)
    assert "s3://bucket/c.parquet" in str(caught.value)
    assert os.listdir(small_disk / "cache" / ".downloading") == []


def test_a_download_racing_another_on_a_full_disk_evicts_room_for_both(
    small_disk: Path,
) -> None:
    """Each download that found the disk full evicted room for its own shard alone: another
    process's download under way then wrote into that room, and the one that had evicted
    failed with a ConfigError (the disk full) while the cache still held a shard no one read
    (six processes of a node on a nearly full disk lost one or two of them, run after run)."""
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    cache.ensure(_item("a.parquet"), _download, pin=False)
    cache.ensure(_item("b.parquet"), _download, pin=False)
    os.utime(cache.path(_item("a.parquet")), (1, 1))  # the least recently used
    started, go, written = threading.Event(), threading.Event(), threading.Event()

    def other(target: str) -> None:  # another process's, paused after its first bytes
        with open(target, "wb") as handle:
            handle.write(b"o" * 4_000)
            handle.flush()
            started.set()
            go.wait(10)
            handle.write(b"o" * (_SHARD - 4_000))
        written.set()

    tries = []

    def mine(target: str) -> None:
        tries.append(target)
        if len(tries) == 2:  # after the eviction, the other download writes on first
            go.set()
            written.wait(10)
        _download(target)

    errors: list[BaseException] = []

    def run_other() -> None:
        try:
            cache.ensure(_item("c.parquet"), other, pin=False)
        except BaseException as error:  # reported by the test
            errors.append(error)

    thread = threading.Thread(target=run_other)
    thread.start()
    assert started.wait(10)
    try:
        path = cache.ensure(_item("d.parquet"), mine, pin=False)
    finally:
        go.set()
        thread.join(10)
    assert errors == []
    assert os.path.getsize(path) == _SHARD
    assert os.path.getsize(cache.path(_item("c.parquet"))) == _SHARD
    assert len(tries) == 2  # the eviction made room for both: one download again, no more


def test_a_download_whose_room_another_took_evicts_again(small_disk: Path) -> None:
    """A download that began after an eviction (no reservation to count then) took the room
    freed for another, which then failed with a ConfigError at its second try, with a shard
    still to evict."""
    cache = ShardCache(str(small_disk / "cache"), max_bytes=1 << 30)
    cache.ensure(_item("a.parquet"), _download, pin=False)
    cache.ensure(_item("b.parquet"), _download, pin=False)
    os.utime(cache.path(_item("a.parquet")), (1, 1))  # the least recently used
    tries = []

    def mine(target: str) -> None:
        tries.append(target)
        if len(tries) == 2:  # another download, begun after the eviction, takes the room
            cache.ensure(_item("c.parquet"), _download, pin=False)
        _download(target)

    path = cache.ensure(_item("d.parquet"), mine, pin=False)
    assert os.path.getsize(path) == _SHARD
    assert os.path.getsize(cache.path(_item("c.parquet"))) == _SHARD
    assert not os.path.exists(cache.path(_item("b.parquet")))
    assert len(tries) == 3


def test_a_download_the_disk_refuses_however_much_is_evicted_is_made_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    """Each eviction making the room (here, a disk with room to spare whose writes fail all
    the same, as when other downloads keep taking it), the download is made again, up to
    `_DISK_FULL_TRIES` times in all, then a ConfigError names the folder, not a loop for ever
    nor a failure blaming the object; nothing is left behind."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1 << 30)
    tries = []

    def refused(target: str) -> None:
        tries.append(target)
        Path(target).write_bytes(b"x" * 10)  # a part written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target)

    with pytest.raises(ConfigError, match=r"disk of the shard cache folder .*is full"):
        cache.ensure(_item("a.parquet"), refused, pin=False)
    assert len(tries) == _DISK_FULL_TRIES
    assert not any(os.path.exists(target) for target in tries)
    assert os.listdir(tmp_path / "cache" / ".downloading") == []
    assert os.listdir(tmp_path / "cache" / ".reserved") == []


def test_a_download_failing_for_another_reason_than_a_full_disk_evicts_nothing(
    tmp_path: Path,
) -> None:
    """Only a full disk has shards evicted and the download made again: another local error
    (here EIO) is raised as it is, after one try, with the cached shards left in place."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1 << 30)
    kept = cache.ensure(_item("a.parquet"), _download, pin=False)
    tries = []

    def failing(target: str) -> None:
        tries.append(target)
        raise OSError(errno.EIO, os.strerror(errno.EIO), target)

    with pytest.raises(OSError) as caught:
        cache.ensure(_item("b.parquet"), failing, pin=False)
    assert caught.value.errno == errno.EIO and not isinstance(caught.value, ConfigError)
    assert len(tries) == 1
    assert os.path.getsize(kept) == _SHARD


def test_decompressed_shards_kept_mapped_take_an_eighth_of_a_smaller_disk(
    small_disk: Path, tmp_path: Path
) -> None:
    """The README's bound on the evicted files a dataset keeps mapped, an eighth of `max_bytes`
    or of the disk where smaller, was an eighth of `max_bytes` alone (8 GiB by default): on a
    small disk, each process kept four decompressed shards mapped, their space held however
    often the cache evicted them."""
    (tmp_path / "data").mkdir()
    for shard in range(3):
        lines = "".join(f'{{"text": "{shard} {i} {"x" * 100}"}}\n' for i in range(100))
        (tmp_path / "data" / f"{shard}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    options = {"cache": {"dir": str(small_disk / "cache")}}  # max_bytes 64 GiB
    dataset = Dataset.from_path("d", tmp_path / "data", io_options=options)
    for shard in range(3):
        assert dataset.read_rows(shard, [99])[0]["text"].startswith(f"{shard} 99 ")
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    assert len(reader._decompressed) == 1  # each of ~11 KB, above 64 KiB / 8: the newest only


def test_room_made_on_a_full_disk_is_what_the_file_needs_and_others_have_still_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each other download under way will write what it reserved less what it has written,
    and no less than nothing (one that wrote more than it reserved leaves the others' count
    alone): the room is enough, to the byte, once the disk's free bytes reach that."""
    folder = CacheFolder(str(tmp_path / "cache"))
    folder.make()
    with contextlib.ExitStack() as under_way:
        for name, reserved, written in (("p", 100, 40), ("q", 50, 50), ("r", 10, 30)):
            under_way.enter_context(folder.name_locked(name))  # another download's
            assert folder.reserve(name, reserved, "", 1 << 30) is not None
            Path(folder.temp(name)).write_bytes(b"w" * written)
        for free, enough in ((1060, True), (1059, False)):  # 1000 + the 60 p has to write
            monkeypatch.setattr(folder, "free_bytes", lambda free=free: free)
            assert folder.evict_to_free(1000, "mine") is enough
