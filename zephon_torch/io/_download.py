"""One object's download into a file: retried, and checked against the listing it came from.

The bytes kept are the listed version's or none: after the transfer the object's size and
version are compared with its listing's (one HEAD; a fresh listing where that differs), since
the cache, and the JSONL line index kept under its name, must not hold another version. An
object gone from the store is a `DataError`; a download whose file went with the cache folder
(a cleaner) stays the `FileNotFoundError` the cache retries once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import fsspec.callbacks

from zephon_torch._progress import Progress
from zephon_torch.errors import DataError
from zephon_torch.io._remote import find_detailed, sized
from zephon_torch.io._retry import RetryPolicy, call_with_retry
from zephon_torch.io._rows import CHANGED_NOTE
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._versions import identity, listed_version


def fetch(
    fs: Any,
    fs_path: str,
    item: CachedObject,
    target: str,
    *,
    dataset: str,
    retry: RetryPolicy,
    show: bool,
) -> None:
    """Writes the object `item` (at `fs_path` on `fs`) to `target`, retried under `retry`;
    `show`: a byte bar on a terminal (prefetches stay quiet: several run at once).

    Raises:
        DataError: the object is missing, or changed since it was listed.
        StorageError: the store failed past the retries.
        FileNotFoundError: `target`'s folder went during the download.
    """

    def attempt() -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        name = f"downloading {os.path.basename(fs_path)}"
        with Progress(item.size if show else 0, name) as bar:
            if show and bar.active:
                fs.get_file(fs_path, target, callback=_BarCallback(bar))
            else:
                fs.get_file(fs_path, target)
        got = os.path.getsize(target)
        if got != item.size:
            check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry)  # else retried
            raise OSError(f"truncated download: {got} of {item.size} bytes")

    try:
        call_with_retry(attempt, url=item.url, policy=retry, what="download")
        check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry)
    except FileNotFoundError:  # listed when the dataset was opened, gone since?
        if _still_there(fs, fs_path, os.path.dirname(target)):
            raise  # no: the cache folder was deleted under the download (see ShardCache.ensure)
        raise DataError(
            f"the object is missing{CHANGED_NOTE}", dataset=dataset, shard=item.url
        ) from None


def check_unchanged(
    fs: Any, fs_path: str, item: CachedObject, *, dataset: str, retry: RetryPolicy
) -> None:
    """``DataError`` when the object's size or version now differs from its listing's.

    Asked first by ``info`` (one HEAD; a listing of one object cost two requests, 13 ms
    a shard against 6 on loopback S3): the same size and version settle it. Else it is
    listed again as the dataset was (``find``: a file system may report a version in
    another form through ``info``), which decides; a version that either listing lacks is
    not compared."""
    if item.url.startswith("hf://") and "@" in item.url:
        return  # listed at a commit: it cannot change (and hub listings are rate-limited)
    key = fs_path.rstrip("/")

    def relist() -> Mapping[str, Any] | None:
        fs.invalidate_cache(fs_path)
        found = find_detailed(fs, fs_path)
        return next((i for n, i in found.items() if n.rstrip("/") == key), None)

    fs.invalidate_cache(fs_path)  # not the first listing's answer again
    try:
        quick: Mapping[str, Any] = fs.info(fs_path)
    except Exception:  # any doubt (denied, missing, an error): the listing decides
        quick = {}
    if quick.get("size") is not None and _same(item, quick):
        return
    info = call_with_retry(relist, url=item.url, policy=retry, what="listing")
    if info is None:
        return  # listed under another name: nothing to compare
    info = sized(fs, fs_path, info, url=item.url, retry=retry)
    if not _same(item, info):
        now = identity(item.url, info)
        raise DataError(
            f"the object changed since it was listed (size {item.size}, version "
            f"{listed_version(item)!r}; now size {now.size}, version {now.version!r})"
            f"{CHANGED_NOTE}",
            dataset=dataset,
            shard=item.url,
        )


def _still_there(fs: Any, fs_path: str, folder: str) -> bool:
    """After a download raised `FileNotFoundError`: whether the object is still in the store,
    so that the error was the cache folder's (deleted under the download, and maybe made
    again at once by another process sharing it). Where the store does not answer, whether
    the download's `folder` is gone."""
    fs.invalidate_cache(fs_path)
    try:
        fs.info(fs_path)
    except FileNotFoundError:
        return False
    except Exception:
        return not os.path.isdir(folder)
    return True


def _same(item: CachedObject, info: Mapping[str, Any]) -> bool:
    """Whether ``info`` (with a size) gives ``item``'s size, and its version where both have
    one."""
    now = identity(item.url, info)
    listed = listed_version(item)
    return now.size == item.size and not (listed and now.version and now.version != listed)


class _BarCallback(fsspec.callbacks.Callback):  # type: ignore[misc]
    """Feeds fsspec's transfer progress to a terminal bar."""

    def __init__(self, bar: Progress) -> None:
        super().__init__()
        self.bar = bar

    def call(self, *args: Any, **kwargs: Any) -> None:
        self.bar.set(int(self.value), total=None if self.size is None else int(self.size))
