"""What a failed read of a listed object is taken for (`read_listed`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import pytest

from zephon_torch.errors import StorageError
from zephon_torch.io._download import read_listed
from zephon_torch.io._retry import RetryPolicy
from zephon_torch.io._shard_cache import CachedObject


def _store() -> tuple[fsspec.AbstractFileSystem, CachedObject]:
    fs = fsspec.filesystem("memory")
    fs.pipe("/bucket/part-0.jsonl", b'{"text": "a"}\n')
    return fs, CachedObject(url="memory://bucket/part-0.jsonl", size=14, version="")


def _not_found() -> bytes:  # what a gateway that lists but serves no downloads answers
    raise FileNotFoundError(2, "Not Found", "https://gateway/download/bucket/part-0.jsonl")


def _read(folder: Path) -> bytes:
    fs, item = _store()
    return read_listed(
        _not_found,
        fs,
        "/bucket/part-0.jsonl",
        item,
        dataset="d",
        retry=RetryPolicy(attempts=1),
        what="downloading",
        folder=str(folder),
    )


def test_not_found_for_a_listed_object_is_the_store_s_not_the_cache_folder_s(
    tmp_path: Path,
) -> None:
    """It was taken for the cache folder deleted under the download, and the run ended in
    a CacheFolderError telling the user to move the cache away from a cleaner."""
    with pytest.raises(StorageError, match="answered 'not found' for an object it lists"):
        _read(tmp_path)
    shutil.rmtree(tmp_path)  # the folder gone under the download: left to the cache to tell
    with pytest.raises(FileNotFoundError):
        _read(tmp_path)
