"""A node's cached copy of a remote shard deleted by someone else (a tmp cleaner, `rm cache/*`)
while the run reads it: the object is not at fault, so the read downloads it again. It raised a
`DataError` blaming the intact remote shard ("not a readable Parquet file", "the shard file is
missing"), which ends a training run (review G, M1)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import memory_copy
from tests.unit.io.test_io_formats_writers import write_mds
from zephon_torch.errors import StorageError
from zephon_torch.io import Dataset
from zephon_torch.io._cache_folder import CacheFolder, CacheFolderError
from zephon_torch.io._shard_cache import CachedObject, ShardCache

ROWS = [{"text": f"document {i} " + "x" * (i % 7)} for i in range(40)]
FORMATS = ["jsonl", "jsonl.gz", "parquet", "mds", "npy"]


def _write(folder: Path, kind: str) -> None:
    """Two shards of `ROWS` in format `kind`, by the real writers."""
    folder.mkdir(parents=True)
    halves = [ROWS[:20], ROWS[20:]]
    for number, rows in enumerate(halves):
        if kind in ("jsonl", "jsonl.gz"):
            text = "".join(json.dumps(row) + "\n" for row in rows).encode()
            data = gzip.compress(text) if kind == "jsonl.gz" else text
            (folder / f"part-{number}.{kind}").write_bytes(data)
        elif kind == "parquet":
            pq.write_table(
                pa.table({"text": [r["text"] for r in rows]}), folder / f"{number}.parquet"
            )
        elif kind == "npy":
            ids = [np.arange(len(r["text"]), dtype=np.int32) for r in rows]
            np.save(folder / f"part-{number}.npy", np.concatenate(ids))
            ends = np.cumsum([0] + [len(i) for i in ids]).astype(np.int64)
            np.save(folder / f"part-{number}.offsets.npy", ends)
    if kind == "mds":
        folder.rmdir()
        write_mds(folder, ROWS, {"text": "str"}, size_limit=1 << 9)


def _remote(tmp_path: Path, kind: str) -> tuple[Dataset, Dataset]:
    """The remote dataset (memory://, a cache of its own) and its local copy."""
    local = tmp_path / "local"
    _write(local, kind)
    options = {"cache": {"dir": str(tmp_path / "cache"), "max_bytes": 1 << 20}}
    remote = Dataset.from_path(
        "d", memory_copy(local), io_options=options, index_cache_dir=str(tmp_path / "i1")
    )
    return remote, Dataset.from_path("d", local, index_cache_dir=str(tmp_path / "i2"))


def _everything(dataset: Dataset) -> list[Any]:
    rows: list[Any] = []
    for shard, info in enumerate(dataset.shards):
        if dataset.format == "npy":
            tokens = dataset.read_tokens(shard, list(range(info.num_rows)), "input_ids")
            assert tokens is not None
            rows += [t.tolist() for t in tokens]
        else:
            rows += dataset.read_rows(shard, list(range(info.num_rows)))
    return rows


def _clean(cache: Path) -> int:
    """A tmp cleaner: deletes the cached files (not the bookkeeping folders)."""
    names = [p for p in cache.iterdir() if not p.name.startswith(".")]
    for path in names:
        path.unlink()
    return len(names)


@pytest.mark.parametrize("kind", FORMATS)
def test_a_copy_deleted_while_another_read_holds_it_is_downloaded_again(
    tmp_path: Path, kind: str
) -> None:
    """Another thread of the process reads the shard (its pin held): the pin counted for
    the next read pointed at the deleted file, which the reader then opened by name."""
    remote, local = _remote(tmp_path, kind)
    expected = _everything(local)
    assert _everything(remote) == expected  # every shard cached
    fresh = _remote_again(remote, tmp_path)  # no shard opened yet
    reader = fresh._reader
    assert reader is not None
    cache = reader._shard_cache()
    held = [reader.objects[url] for url in reader.objects]
    with contextlib.ExitStack() as stack:
        for fs_path, item in held:  # every file held, as reads under way would
            stack.enter_context(cache.open(item, reader.downloads.downloader(fs_path, item)))
        assert _clean(tmp_path / "cache") >= len(held)  # with decompressed copies
        assert _everything(fresh) == expected
    assert cache._pins.held == {}


def _remote_again(remote: Dataset, tmp_path: Path) -> Dataset:
    """A second open of the same remote dataset in this process: it reads the same cache
    folder, and has opened none of its files yet."""
    reader = remote._reader
    assert reader is not None
    options = {"cache": {"dir": str(tmp_path / "cache"), "max_bytes": 1 << 20}}
    again = Dataset.from_path(
        "d", reader.url, io_options=options, index_cache_dir=str(tmp_path / "i1")
    )
    return again


@pytest.mark.parametrize("kind", FORMATS)
def test_a_copy_deleted_between_its_pin_and_the_reader_s_open_is_read_once_more(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner strikes after the cache pinned the file and before the local reader opens
    it by name: the reader's error (a DataError, or an OSError) is not the data's."""
    remote, local = _remote(tmp_path, kind)
    reader = remote._reader
    assert reader is not None
    cache = reader._shard_cache()
    opened = cache.open
    strikes: list[str] = []

    @contextlib.contextmanager
    def cleaner_after_pin(item: Any, download: Callable[[str], None]) -> Iterator[str]:
        with opened(item, download) as path:
            if not strikes:
                strikes.append(path)
                os.unlink(path)
            yield path

    monkeypatch.setattr(cache, "open", cleaner_after_pin)
    assert _everything(remote) == _everything(local)
    assert len(strikes) == 1


def test_a_copy_deleted_under_every_read_is_a_storage_error_naming_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote, _ = _remote(tmp_path, "parquet")
    reader = remote._reader
    assert reader is not None
    cache = reader._shard_cache()
    opened = cache.open

    @contextlib.contextmanager
    def cleaner_after_pin(item: Any, download: Callable[[str], None]) -> Iterator[str]:
        with opened(item, download) as path:
            os.unlink(path)
            yield path

    monkeypatch.setattr(cache, "open", cleaner_after_pin)
    with pytest.raises(StorageError, match=r"was deleted under the read .* and again") as caught:
        remote.read_rows(0, [0])
    assert caught.value.url == remote.shards[0].path


def test_pins_follow_a_copy_downloaded_again_and_close_with_the_last(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    item = CachedObject(url="s3://bucket/a.jsonl", size=3, version="v1")
    downloads: list[str] = []

    def download(target: str) -> None:
        downloads.append(target)
        Path(target).write_bytes(b"abc")

    with cache.open(item, download) as first:
        os.unlink(first)
        assert cache.lost(item)
        with cache.open(item, download) as second:
            assert Path(second).read_bytes() == b"abc" and not cache.lost(item)
        assert not cache.lost(item)  # the pin left is on the new file
    assert len(downloads) == 2 and cache._pins.held == {}
    assert Path(cache.path(item)).read_bytes() == b"abc"


def test_a_folder_deleted_as_it_is_made_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner's `rm -rf` between the folder's make and its check: that read as a folder
    that "cannot be written" (a CacheFolderError, no second try) (review G, L1)."""
    folder = CacheFolder(str(tmp_path / "cache"))
    checked = os.access
    deleted: list[str] = []

    def cleaner_first(path: Any, mode: int) -> bool:
        if not deleted:
            deleted.append(str(path))
            shutil.rmtree(tmp_path / "cache")
        return checked(path, mode)

    monkeypatch.setattr(os, "access", cleaner_first)
    folder.make()
    assert deleted and folder.intact()
    # a folder that is there and cannot be written is still refused at once
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(CacheFolderError, match=r"cannot be written"):
        folder.make()


def test_a_long_wait_for_the_folder_lock_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder's lock is held for moments; a holder stopped (SIGSTOP) or stuck in I/O held
    every other process's reservation without a word (a review's doubt). Here another open of
    the lock file holds it, as another process would."""
    import fcntl
    import threading
    import warnings

    from zephon_torch.errors import ZephonWarning
    from zephon_torch.io import _cache_folder

    monkeypatch.setattr(_cache_folder, "STALL_S", 0.3)
    folder = CacheFolder(str(tmp_path / "cache"))
    folder.make()
    holder = os.open(folder._lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    released = threading.Timer(1.0, lambda: os.close(holder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        released.start()
        folder.evict_to_free(0)  # waits for the lock, then does its moment's work
    said = [str(w.message) for w in caught if issubclass(w.category, ZephonWarning)]
    assert len(said) == 1 and "waiting 0 s for the lock of the shard cache" in said[0]
    with warnings.catch_warnings(record=True) as caught:  # not held: no wait, no warning
        warnings.simplefilter("always")
        folder.evict_to_free(0)
    assert not [w for w in caught if issubclass(w.category, ZephonWarning)]


@pytest.mark.parametrize("deletions", [2, 3])
def test_a_folder_is_made_up_to_three_times_while_a_cleaner_deletes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deletions: int
) -> None:
    """Deleted as it is made twice, the third make keeps it; deleted three times, the folder
    is taken for one a cleaner keeps deleting, a CacheFolderError naming it."""
    folder = CacheFolder(str(tmp_path / "cache"))
    checked = os.access
    deleted: list[str] = []

    def cleaner(path: Any, mode: int) -> bool:
        if len(deleted) < deletions and os.path.isdir(tmp_path / "cache"):
            deleted.append(str(path))
            shutil.rmtree(tmp_path / "cache")
        return checked(path, mode)

    monkeypatch.setattr(os, "access", cleaner)
    if deletions == 3:
        with pytest.raises(CacheFolderError, match=r"cache.* was deleted as it was made"):
            folder.make()
    else:
        folder.make()
        assert folder.intact()
    assert len(deleted) == deletions


def test_a_folder_there_that_cannot_be_written_is_refused_after_one_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a folder deleted as it is made is made again: one there and unwritable is not
    checked once more (it stays so)."""
    folder = CacheFolder(str(tmp_path / "cache"))
    checks: list[str] = []

    def unwritable(path: Any, mode: int) -> bool:
        checks.append(str(path))
        return False

    monkeypatch.setattr(os, "access", unwritable)
    with pytest.raises(CacheFolderError, match=r"cannot be written"):
        folder.make()
    assert checks == [os.path.join(str(tmp_path / "cache"), "")]
