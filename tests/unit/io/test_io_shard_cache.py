"""The node-local shard cache in one process: LRU eviction, atomic downloads, copies changed or
cut short downloaded again, any object name cached, and a cache folder deleted or unwritable."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest

from tests.helpers import cache_item, cache_writer, cached_files
from zephon_torch.errors import ConfigError, StorageError, ZephonWarning
from zephon_torch.io import Dataset, _cache_folder
from zephon_torch.io._cache_folder import _RESERVE, _TMP, CacheFolder, CacheFolderError
from zephon_torch.io._locks import lock_file, release_file
from zephon_torch.io._shard_cache import CachedObject, ShardCache


def test_the_least_recently_used_shard_is_evicted_first(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=300)
    a, b, c = cache_item("a.jsonl", 100), cache_item("b.jsonl", 100), cache_item("c.jsonl", 100)
    for item in (a, b, c):
        cache.ensure(item, cache_writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    cache.ensure(a, cache_writer(b"never called"), pin=False)  # a is now the newest
    cache.ensure(cache_item("d.jsonl", 100), cache_writer(b"y" * 100), pin=False)
    names = {name.split("-", 1)[1] for name in cached_files(tmp_path)}
    assert names == {"a.jsonl", "c.jsonl", "d.jsonl"}
    assert cache.used_bytes() <= 300


def test_files_the_cache_did_not_write_are_neither_counted_nor_evicted(tmp_path: Path) -> None:
    """A `dir` pointed at a folder in use: its files were evicted as least recently used."""
    (tmp_path / "checkpoint.pt").write_bytes(b"c" * 250)
    (tmp_path / "abc-notes.txt").write_bytes(b"n" * 250)
    cache = ShardCache(str(tmp_path), max_bytes=200)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        cache.ensure(cache_item(name, 100), cache_writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    assert {name.split("-", 1)[-1] for name in cached_files(tmp_path)} == {
        "checkpoint.pt",
        "notes.txt",
        "b.jsonl",
        "c.jsonl",
    }
    assert cache.used_bytes() == 200


def test_a_shard_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=200, full_timeout=0.3)
    a, b = cache_item("a.jsonl", 100), cache_item("b.jsonl", 100)
    with cache.open(a, cache_writer(b"a" * 100)) as path_a, cache.open(b, cache_writer(b"b" * 100)):
        with pytest.raises(OSError, match="full of shards in use"):
            cache.ensure(cache_item("c.jsonl", 100), cache_writer(b"c" * 100), pin=False)
        assert Path(path_a).read_bytes() == b"a" * 100
    cache.ensure(cache_item("c.jsonl", 100), cache_writer(b"c" * 100), pin=False)
    assert cache.used_bytes() == 200


def test_no_partial_file_is_ever_visible(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    item = cache_item("slow.jsonl", 1000)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if os.path.exists(cache.path(item)):
                seen.append(os.path.getsize(cache.path(item)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    cache.ensure(item, cache_writer(b"z" * 1000, delay=0.2), pin=False)
    deadline = time.monotonic() + 5  # a loaded machine may not have run the watcher yet
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    watcher.join()
    assert seen and set(seen) == {1000}


def test_a_failed_or_short_download_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10_000)
    with pytest.raises(OSError, match="expected 100"):
        cache.ensure(cache_item("a.jsonl", 100), cache_writer(b"short"), pin=False)
    assert cached_files(tmp_path) == {}
    assert os.listdir(tmp_path / _TMP) == []
    assert os.listdir(tmp_path / _RESERVE) == []


def test_a_shard_larger_than_the_limit_is_an_error_naming_it(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=10)
    with pytest.raises(ConfigError, match=r"s3://bucket/huge.parquet"):
        cache.ensure(cache_item("huge.parquet", 11), cache_writer(b"x" * 11), pin=False)


def test_a_shard_or_made_file_of_exactly_the_limit_is_cached_in_place_of_the_others(
    tmp_path: Path,
) -> None:
    """`max_bytes` is the most the cache holds: a file of that size is refused only when
    larger, and fits once every other shard (none in use) is evicted."""
    cache = ShardCache(str(tmp_path), max_bytes=100)
    cache.ensure(cache_item("small.parquet", 40), cache_writer(b"x" * 40), pin=False)
    whole = cache_item("whole.parquet", 100)
    path = cache.ensure(whole, cache_writer(b"y" * 100), pin=False)
    assert Path(path).read_bytes() == b"y" * 100
    assert [name.split("-", 1)[1] for name in cached_files(tmp_path)] == ["whole.parquet"]

    def make(target: str) -> None:
        Path(target).write_bytes(b"z" * 100)

    with cache.open_made("made", "s3://bucket/made.jsonl.gz", make) as made:
        assert Path(made).read_bytes() == b"z" * 100
    assert cache.used_bytes() == 100


def test_a_made_file_larger_than_the_limit_is_an_error_naming_it_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Its size is known once it is made: then refused as a shard is, not reserved (it can
    never fit) and waited for until the cache is taken to be full of shards in use."""
    cache = ShardCache(str(tmp_path), max_bytes=10)

    def make(target: str) -> None:
        Path(target).write_bytes(b"x" * 11)

    with (
        pytest.raises(ConfigError, match=r"s3://bucket/huge.jsonl.gz"),
        cache.open_made("huge", "s3://bucket/huge.jsonl.gz", make),
    ):
        pass
    assert not cached_files(tmp_path)
    assert os.listdir(tmp_path / _TMP) == os.listdir(tmp_path / _RESERVE) == []


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
    assert len(cached_files(tmp_path / "c")) == 2


def test_a_cached_copy_cut_short_is_downloaded_again_by_the_next_open(tmp_path: Path) -> None:
    """A copy cut short on the node's disk (a cleaner, a full disk, a crash) was pinned as it
    was: every read of every later job failed on it, blaming the remote object."""
    fs = fsspec.filesystem("memory")
    rows = [{"n": number, "text": f"row {number} " * 20} for number in range(50)]
    fs.pipe("/cut/a.jsonl", "".join(f"{json.dumps(row)}\n" for row in rows).encode())
    options = {"cache": {"dir": str(tmp_path / "c"), "prefetch_bytes": 0}}
    first = Dataset.from_path("d", "memory:///cut", io_options=options)
    assert first.read_rows(0, [49]) == [rows[49]]
    [name] = cached_files(tmp_path / "c")
    copy = tmp_path / "c" / name
    os.truncate(copy, copy.stat().st_size // 2)
    later = Dataset.from_path("d", "memory:///cut", io_options=options)
    assert later.read_rows(0, [49, 0]) == [rows[49], rows[0]]
    assert cached_files(tmp_path / "c") == {name: fs.cat("/cut/a.jsonl")}


def test_a_cut_short_copy_another_process_reads_is_an_error_naming_it(tmp_path: Path) -> None:
    """It cannot be deleted under that read, so it is named, not read as it is."""
    item = cache_item("a.jsonl", 100)
    reading = ShardCache(str(tmp_path), max_bytes=1000)  # another process's pins
    with reading.open(item, cache_writer(b"a" * 100)) as path:
        os.truncate(path, 40)
        cache = ShardCache(str(tmp_path), max_bytes=1000)
        with pytest.raises(StorageError, match=r"cached copy .*a\.jsonl' is 40 bytes, not the 100"):
            cache.ensure(item, cache_writer(b"b" * 100), pin=False)
    cache.ensure(item, cache_writer(b"b" * 100), pin=False)  # read no more: replaced
    assert Path(path).read_bytes() == b"b" * 100


def test_a_shard_with_a_long_basename_is_cached(tmp_path: Path) -> None:
    """Object keys may be 1024 bytes: the name, its temporary file and its reservation must
    stay under NAME_MAX, keeping the extension readers go by."""
    cache = ShardCache(str(tmp_path / "c"), max_bytes=1000)
    base = "x" * 240 + ".jsonl.zst"
    path = cache.ensure(cache_item(base, 10), cache_writer(b"0123456789"), pin=False)
    assert Path(path).read_bytes() == b"0123456789"
    assert path.endswith(".jsonl.zst") and len(os.path.basename(path)) < 200
    made = f"{tmp_path}/{base} (decompressed)"
    with cache.open_made("k", made, lambda target: Path(target).write_bytes(b"m")) as local:
        assert Path(local).read_bytes() == b"m"


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
    cache.ensure(cache_item("a.jsonl", 10), cache_writer(b"a" * 10), pin=False)
    shutil.rmtree(tmp_path / "cache")
    with cache.open(cache_item("b.jsonl", 10), cache_writer(b"b" * 10)) as path:
        assert Path(path).read_bytes() == b"b" * 10
    with cache.open(cache_item("a.jsonl", 10), cache_writer(b"a" * 10)) as path:  # downloaded again
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

    path = cache.ensure(cache_item("a.jsonl", 10), download, pin=False)
    assert Path(path).read_bytes() == b"x" * 10 and len(calls) == 2

    def always(target: str) -> None:  # every try loses its folder
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        Path(target).write_bytes(b"y" * 10)

    # it was the bare FileNotFoundError of a temporary file, naming no URL
    with pytest.raises(CacheFolderError, match=r"'s3://bucket/b\.jsonl'") as caught:
        cache.ensure(cache_item("b.jsonl", 10), always, pin=False)
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

    path = cache.ensure(cache_item("a.jsonl", 10), download, pin=False)
    assert Path(path).read_bytes() == b"x" * 10 and len(calls) == 2


def test_a_download_made_once_more_in_a_folder_made_again_fails_with_its_own_error(
    tmp_path: Path,
) -> None:
    """The folder deleted under the first download only: the second one's failure, for its
    own reason (here EIO), is raised as it is, not taken for the folder deleted again."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    calls = []

    def download(target: str) -> None:
        calls.append(target)
        if len(calls) == 1:
            shutil.rmtree(tmp_path / "cache")  # a cleaner, mid-download
            Path(target).write_bytes(b"x" * 10)
        raise OSError(errno.EIO, os.strerror(errno.EIO), target)

    with pytest.raises(OSError) as caught:
        cache.ensure(cache_item("a.jsonl", 10), download, pin=False)
    assert caught.value.errno == errno.EIO and len(calls) == 2


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
    `.downloading`, then a bare PermissionError came from moving them into the folder. It is
    not taken for a folder a cleaner deleted (nothing is downloaded once more)."""
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1000)
    with (
        _unwritable(tmp_path / "cache"),
        pytest.raises(
            ConfigError, match=r"shard cache folder .*cache.* cannot be written"
        ) as caught,
    ):
        cache.ensure(cache_item("a.jsonl", 10), cache_writer(b"x" * 10), pin=False)
    assert "deleted" not in str(caught.value)


def test_a_cache_folder_that_cannot_be_made_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"shard cache folder .*afile/cache.* Not a directory"):
        ShardCache(str(tmp_path / "afile" / "cache"), max_bytes=1000)


def test_a_reservation_evicts_room_for_the_downloads_under_way_too(tmp_path: Path) -> None:
    """Files, the reservations of downloads under way and the new one together fit in
    `max_bytes`: eviction goes on until they do, not until the files and the new one do."""
    cache = ShardCache(str(tmp_path), max_bytes=300, full_timeout=0.5)
    for name in ("a.jsonl", "b.jsonl"):
        cache.ensure(cache_item(name, 100), cache_writer(b"x" * 100), pin=False)
        time.sleep(0.01)
    under_way = cache_item("c.jsonl", 100)
    with cache._folder.name_locked(under_way.name):  # another download, reserved
        assert cache._folder.reserve(under_way.name, 100, "", 300) is not None
        cache.ensure(cache_item("d.jsonl", 100), cache_writer(b"d" * 100), pin=False)
    assert {name.split("-", 1)[1] for name in cached_files(tmp_path)} == {"b.jsonl", "d.jsonl"}


def test_a_reservation_leaves_the_partial_file_of_a_download_under_way(tmp_path: Path) -> None:
    """Only a name whose lock no one holds is a dead download's to sweep: the temporary file
    of one under way (its name's lock held) stays, whatever its name's suffix."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    under_way = cache_item("slow.jsonl", 100)
    with cache._folder.name_locked(under_way.name):
        assert cache._folder.reserve(under_way.name, 100, "", 1000) is not None
        partial = Path(cache._folder.temp(under_way.name))
        partial.write_bytes(b"p" * 40)
        cache.ensure(cache_item("a.jsonl", 100), cache_writer(b"a" * 100), pin=False)
        assert partial.read_bytes() == b"p" * 40
        assert len(os.listdir(tmp_path / _RESERVE)) == 1


def test_a_reservation_sweeps_lock_files_no_one_holds_and_leaves_those_held(tmp_path: Path) -> None:
    """A process killed holding a name's lock before it reserved (waiting for space) leaves
    its lock file alone: the next reservation deletes it, and not a lock file held."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    left = Path(cache._folder.name_lock("dead.jsonl"))
    left.touch()
    held = cache_item("held.jsonl", 100)
    with cache._folder.name_locked(held.name):
        cache.ensure(cache_item("a.jsonl", 100), cache_writer(b"a" * 100), pin=False)
        assert not left.exists()
        assert Path(cache._folder.name_lock(held.name)).exists()


def test_a_link_with_a_cached_file_s_name_is_neither_counted_nor_evicted(tmp_path: Path) -> None:
    """Only regular files are the cache's: a symbolic link lying in the folder, named as a
    cached file would be, is a user's, as is what it points at."""
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"u" * 250)
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=200)
    link = Path(cache.path(cache_item("linked.jsonl", 250)))
    link.symlink_to(target)
    os.utime(link, (1, 1), follow_symlinks=False)  # the least recently used, were it counted
    assert cache.used_bytes() == 0
    for name in ("a.jsonl", "b.jsonl"):
        cache.ensure(cache_item(name, 100), cache_writer(b"x" * 100), pin=False)
    assert link.is_symlink() and target.read_bytes() == b"u" * 250
    assert cache.used_bytes() == 200


def test_a_file_deleted_as_the_folder_is_listed_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner deleting a cached file between its listing and its `stat`: the file is not
    counted (nor the one listed before it counted twice)."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    gone, kept = cache_item("gone.jsonl", 100), cache_item("kept.jsonl", 60)
    for item in (gone, kept):
        cache.ensure(item, cache_writer(b"x" * item.size), pin=False)
    listed = os.scandir

    class Cleaned:
        """The folder's listing, with `gone` deleted just as it is listed."""

        def __init__(self, folder: str) -> None:
            self.listing = listed(folder)

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return self.entries()

        def __exit__(self, *exc: object) -> None:
            self.listing.close()

        def entries(self) -> Iterator[os.DirEntry[str]]:
            for entry in self.listing:
                if entry.path == cache.path(gone):
                    os.unlink(entry.path)
                yield entry

    monkeypatch.setattr(os, "scandir", Cleaned)
    assert cache.used_bytes() == 60


def _waiting_for_locks(cache: ShardCache, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once `cache` waits for a name's lock that another holds."""
    waiting = threading.Event()
    wait = cache._folder._wait_for_lock

    def noted(name: str, path: str) -> int:
        waiting.set()
        return wait(name, path)

    monkeypatch.setattr(cache._folder, "_wait_for_lock", noted)
    return waiting


def test_hits_misses_and_bytes_downloaded_count_each_use_of_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard or made file found (at once, or once another process that was placing it lets
    its name's lock go) is a hit; one downloaded or made is a miss."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    other = ShardCache(str(tmp_path), max_bytes=1000)  # another process's
    waiting = _waiting_for_locks(cache, monkeypatch)
    assert (cache.hits, cache.misses, cache.bytes_downloaded) == (0, 0, 0)
    shard, made = cache_item("a.jsonl", 60), ("k", "s3://bucket/b.jsonl.gz")

    def placed_by_other(use: Callable[[], object]) -> None:
        """`use` while `other` holds the name's lock, placing the file once `use` waits."""
        begun = threading.Event()

        def write(target: str) -> None:
            begun.set()
            assert waiting.wait(10)
            Path(target).write_bytes(b"o" * 60)

        def place() -> None:
            if use is first_shard:
                other.ensure(shard, write, pin=False)
            else:
                with other.open_made(*made, write):
                    pass

        placing = threading.Thread(target=place)
        placing.start()
        assert begun.wait(10)
        use()
        placing.join(10)
        waiting.clear()

    def first_shard() -> object:
        return cache.ensure(shard, cache_writer(b"x" * 60), pin=False)

    def first_made() -> object:
        with cache.open_made(*made, lambda target: Path(target).write_bytes(b"m" * 30)):
            return None

    placed_by_other(first_shard)  # a hit, found under the lock
    placed_by_other(first_made)
    assert (cache.hits, cache.misses, cache.bytes_downloaded) == (2, 0, 0)
    assert (other.hits, other.misses, other.bytes_downloaded) == (0, 2, 60)
    first_shard()  # hits, found at once
    first_made()
    cache.ensure(cache_item("c.jsonl", 40), cache_writer(b"c" * 40), pin=False)
    with cache.open_made(
        "j", "s3://bucket/d.jsonl.gz", lambda target: Path(target).write_bytes(b"d")
    ):
        pass
    assert (cache.hits, cache.misses, cache.bytes_downloaded) == (4, 2, 40)


def test_a_wait_for_a_name_s_lock_polls_ever_less_often_and_warns_once_per_stall_s_unwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that each poll moves 10 s on: the holder writes at 30 s and 160 s, and lets
    go at 260 s. The waiter warns at 90 s and 150 s (60 s without a write, then 60 s after the
    last warning) and at 220 s (60 s after the second write), and polls at 2 ms, doubling up
    to 50 ms."""
    folder = CacheFolder(str(tmp_path))
    folder.make()
    name = cache_item("a.jsonl", 100).name
    held = lock_file(folder.name_lock(name), wait=False)  # another process's download
    assert held is not None
    partial = Path(folder.temp(name))
    partial.write_bytes(b"p")
    now, polls = [0.0], []

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            polls.append(seconds)
            now[0] += 10
            if now[0] in (30, 160):
                partial.write_bytes(partial.read_bytes() + b"p")
            if now[0] == 260:
                release_file(folder.name_lock(name), held)

    monkeypatch.setattr(_cache_folder, "time", Clock)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with folder.name_locked(name):
            assert now[0] == 260
    said = [str(w.message) for w in caught if issubclass(w.category, ZephonWarning)]
    assert [note.split(" s ")[0] for note in said] == ["waiting 60", "waiting 120", "waiting 60"]
    assert name in said[0] and "SIGSTOP" in said[0]
    assert polls[:7] == [0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05] and len(polls) == 26


def test_touching_or_discarding_a_copy_not_there_says_whether_it_is_there_after(
    tmp_path: Path,
) -> None:
    """`touch` is False for a copy not cached; `discard` is True for one already gone (a
    cleaner deleted it), as for one it deleted."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    item = cache_item("a.jsonl", 10)
    assert not cache.touch(item)
    cache.ensure(item, cache_writer(b"a" * 10), pin=False)
    assert cache.touch(item)
    os.unlink(cache.path(item))  # a cleaner's
    assert cache.discard(item) and not cache.touch(item)


def test_a_copy_in_use_that_is_not_discarded_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """Each refused deletion (a reader holds the copy) closes what it opened: a descriptor
    left open would keep the file's space for the process's life once it is deleted."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    item = cache_item("a.jsonl", 10)
    with cache.open(item, cache_writer(b"a" * 10)):
        before = len(os.listdir("/proc/self/fd"))
        assert not any(cache.discard(item) for _ in range(5))
        assert len(os.listdir("/proc/self/fd")) == before


def test_a_copy_replaced_as_it_is_discarded_is_left_and_not_said_to_be_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file locked is not the one under the name then (another was placed there): the
    name's file is left, and `discard` says it is not gone."""
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    item = cache_item("a.jsonl", 10)
    cache.ensure(item, cache_writer(b"a" * 10), pin=False)
    opened = _cache_folder.open_tracked

    def replaced_once_open(path: str, flags: int) -> int:
        fd = opened(path, flags)
        newer = tmp_path / "newer"
        newer.write_bytes(b"b" * 10)
        os.replace(newer, path)
        return fd

    monkeypatch.setattr(_cache_folder, "open_tracked", replaced_once_open)
    assert not cache.discard(item)
    assert Path(cache.path(item)).read_bytes() == b"b" * 10
