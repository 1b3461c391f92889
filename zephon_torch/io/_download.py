"""Reads of listed objects, retried and checked against the listing they came from.

The bytes kept are the listed version's or none: after a download the object's size and
version are compared with its listing's (one HEAD; a fresh listing where that differs), since
the cache, and the JSONL line index kept under its name, must not hold another version; on S3,
a download whose every GET was answered with the listed ETag needs no HEAD (see
`_s3_answers`), its bytes being that version's. A read
that fails for good asks the store the same, since stores answer a read of an object changed or
gone since its listing in many ways (S3: a 416 for a range past a shrunk end, NoSuchKey, s3fs's
FileExpired for another ETag): such an object is a `DataError` naming the shard, any other such
failure a `StorageError` naming the URL. A download whose file went with the cache folder (a
cleaner) stays the `FileNotFoundError` the cache retries once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import fsspec.callbacks

from zephon_torch._progress import Progress
from zephon_torch.errors import DataError, StorageError, ZephonError, secret_free, without_secrets
from zephon_torch.io._remote import find_detailed, sized
from zephon_torch.io._retry import RetryPolicy, call_with_retry, disk_full, quietly
from zephon_torch.io._rows import CHANGED_NOTE
from zephon_torch.io._s3_answers import answered_listed
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._stall import Pace, bounded, get_file
from zephon_torch.io._versions import identity, listed_version

T = TypeVar("T")


def fetch(
    fs: Any,
    fs_path: str,
    item: CachedObject,
    target: str,
    *,
    dataset: str,
    retry: RetryPolicy,
    show: bool,
    stop: threading.Event | None = None,
) -> None:
    """Writes the object `item` (at `fs_path` on `fs`) to `target`, retried under `retry`
    until `stop` is set (see `call_with_retry`); `show`: a byte bar on a terminal (prefetches
    stay quiet: several run at once).

    Raises:
        DataError: the object is missing, or changed since it was listed.
        StorageError: the store failed past the retries, or for good (see `read_listed`).
        OSError: unchanged, a full disk under `target` or an error naming a local file (a
            `FileNotFoundError` where `target`'s folder went during the download).
    """

    # the ETags S3 answered the last attempt's GETs with (a list of its own: a GET of an
    # attempt let go may still end, and add to its list)
    answers: list[str] = []

    def attempt() -> None:
        nonlocal answers
        answers = []
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        name = f"downloading {os.path.basename(fs_path)}"
        with Progress(item.size if show else 0, name) as bar:
            pace = Pace(retry.min_rate, retry.rate_window, item.size)
            capped = _Capped(item.size, bar if show and bar.active else None, pace)
            try:
                get_file(fs, fs_path, target, capped, pace, answers)
            except _PastListedSize:
                check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry)  # else retried
                raise OSError(f"more than the {item.size} bytes listed came") from None
        got = os.path.getsize(target)
        if got != item.size:
            check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry)  # else retried
            raise OSError(f"truncated download: {got} of {item.size} bytes")

    folder = os.path.dirname(target)
    read_listed(
        attempt,
        fs,
        fs_path,
        item,
        dataset=dataset,
        retry=retry,
        what="download",
        folder=folder,
        stop=stop,
    )
    if not answered_listed(answers, listed_version(item)):  # else the bytes are its own
        check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry)


def read_listed(
    call: Callable[[], T],
    fs: Any,
    fs_path: str,
    item: CachedObject,
    *,
    dataset: str,
    retry: RetryPolicy,
    what: str,
    shard: str | None = None,
    folder: str | None = None,
    stop: threading.Event | None = None,
) -> T:
    """Returns `call()`, a read of the listed object `item` (at `fs_path` on `fs`), retried
    under `retry`; a failure that is not retried asks the store whether the object is still
    as listed, to say which of the errors below it is.

    Args:
        call: the read.
        fs: the file system.
        fs_path: the object's path on `fs`.
        item: the object as listed.
        dataset: the dataset, named in errors.
        retry: the retry bounds.
        what: a few words on the read ("reading the footer"), for the message.
        shard: the shard errors name: the object's URL by default (a `.npy` token file's for
            its offsets file).
        folder: the local folder `call` writes into (a download's).
        stop: once set, no retry starts (see `call_with_retry`).

    Raises:
        DataError: the object is missing, or changed since it was listed.
        StorageError: the store failed past the retries, or for good (or refused the read,
            see `refused`) on an object still as listed.
        ConfigError: no usable credentials, or access denied (see `call_with_retry`).
        OSError: unchanged, a full disk under `folder` or an error naming a file in it (a
            `FileNotFoundError` where `folder` went during the call, the object still there).
    """
    shard = item.url if shard is None else shard
    try:
        return call_with_retry(call, url=item.url, policy=retry, what=what, stop=stop)
    except StorageError as error:
        if error.reason == "refused":  # a 416 for a range past a shrunk end, say
            _raise_if_changed(fs, fs_path, item, dataset=dataset, retry=retry, shard=shard)
        raise
    except ZephonError:
        raise
    except OSError as error:
        if folder is not None and (disk_full(error) or _names_file_in(error, folder)):
            raise  # the local disk's or file's, for the cache to tell (see ShardCache.ensure)
        present = _present(fs, fs_path, retry)
        # the folder's only where it is gone: a store that answers "not found" to a read of
        # an object it lists (a gateway serving listings, not downloads) is the store's
        gone_folder = folder is not None and present is not False and not os.path.isdir(folder)
        if isinstance(error, FileNotFoundError) and gone_folder:
            raise  # the cache folder went under the download (see ShardCache.ensure)
        if isinstance(error, FileNotFoundError) and present is True:
            raise StorageError(
                f"{what}: the store answered 'not found' for an object it lists (check "
                f"`endpoint_url`, and that the credentials may read objects, not only list "
                f"them): {type(error).__name__}: {error}",
                url=item.url,
            ) from secret_free(error)
        if present is False or (present is None and isinstance(error, FileNotFoundError)):
            subject = _subject(item, shard)
            raise DataError(
                f"{subject} is missing since it was listed{CHANGED_NOTE}",
                dataset=dataset,
                shard=shard,
            ) from secret_free(error)
        _raise_if_changed(fs, fs_path, item, dataset=dataset, retry=retry, shard=shard)
        raise StorageError(
            f"{what} failed, and not in a way worth retrying: {type(error).__name__}: {error}",
            url=item.url,
        ) from secret_free(error)


def _raise_if_changed(
    fs: Any, fs_path: str, item: CachedObject, *, dataset: str, retry: RetryPolicy, shard: str
) -> None:
    """The `DataError` of `check_unchanged`, if the object changed since it was listed; a
    failure of the check itself is not raised: the caller raises the read's own error."""
    try:
        check_unchanged(fs, fs_path, item, dataset=dataset, retry=retry, shard=shard)
    except DataError:
        raise
    except Exception:  # the read's error is the one to tell
        pass


def check_unchanged(
    fs: Any,
    fs_path: str,
    item: CachedObject,
    *,
    dataset: str,
    retry: RetryPolicy,
    shard: str | None = None,
) -> None:
    """``DataError`` when the object's size or version now differs from its listing's, naming
    `shard` (by default the object's URL).

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
        found = find_detailed(fs, fs_path, bound=left)
        return next((i for n, i in found.items() if n.rstrip("/") == key), None)

    began = time.monotonic()
    fs.invalidate_cache(fs_path)  # not the first listing's answer again
    try:  # one `timeout` for the whole check: a store that stops answering holds no lock long
        quick: Mapping[str, Any] = quietly(
            lambda: bounded(fs, "info", fs_path, retry=retry, what="asking its size")
        )
    except Exception:  # any doubt (denied, missing, an error, a stall): the listing decides
        quick = {}
    if quick.get("size") is not None and _same(item, quick):
        return
    spent = time.monotonic() - began
    left = dataclasses.replace(retry, timeout=max(0.0, retry.timeout - spent))
    info = call_with_retry(relist, url=item.url, policy=left, what="listing")
    if info is None:
        return  # listed under another name: nothing to compare
    info = sized(fs, fs_path, info, url=item.url, retry=retry)
    if not _same(item, info):
        now = identity(item.url, info)
        shard = item.url if shard is None else shard
        raise DataError(
            f"{_subject(item, shard)} changed since it was listed (size {item.size}, version "
            f"{listed_version(item)!r}; now size {now.size}, version {now.version!r})"
            f"{CHANGED_NOTE}",
            dataset=dataset,
            shard=shard,
        )


def _subject(item: CachedObject, shard: str) -> str:
    """How a message on the object `item` names it, in an error naming `shard`."""
    if shard == item.url:
        return "the object"
    return f"its file {without_secrets(os.path.basename(item.url))!r}"


def _names_file_in(error: OSError, folder: str) -> bool:
    """Whether `error` names a local file in `folder` (as `open` and `os` calls do)."""
    name = error.filename
    return isinstance(name, str) and os.path.abspath(name).startswith(folder + os.sep)


def _present(fs: Any, fs_path: str, retry: RetryPolicy) -> bool | None:
    """Whether the store holds the object now (a FileNotFoundError of a download may be the
    cache folder's, deleted under it, and maybe made again at once by another process sharing
    it); None where the store does not answer (within `retry`'s `timeout`)."""
    fs.invalidate_cache(fs_path)
    try:
        quietly(lambda: bounded(fs, "info", fs_path, retry=retry, what="asking its size"))
    except FileNotFoundError:
        return False
    except Exception:  # any doubt (denied, an error): not known
        return None
    return True


def _same(item: CachedObject, info: Mapping[str, Any]) -> bool:
    """Whether ``info`` (with a size) gives ``item``'s size, and its version where both have
    one. An ETag is the same quoted or not: adlfs 2023.8 and 2024.12 list it bare and give it
    quoted by ``info`` (every az:// read was "changed since it was listed")."""
    now = identity(item.url, info)
    listed = listed_version(item).strip('"')
    return now.size == item.size and not (
        listed and now.version and now.version.strip('"') != listed
    )


class _PastListedSize(Exception):
    """A download brought more bytes than its object was listed with."""


class _Capped(fsspec.callbacks.NoOpCallback):  # type: ignore[misc]
    """Stops a download as soon as more bytes came than the object's listed `size` (an object
    rewritten larger since its listing is not copied whole into the cache, past its
    reservation and `max_bytes`: `fetch` names the change); feeds a terminal `bar`, if any,
    the transfer's progress. Where a file system reports no progress, the size is checked
    after the download only.

    A `NoOpCallback` by class: huggingface_hub's file system keeps its own download (one
    stream, or Xet's parallel one) only for those (and tqdm's), and copies any other callback's
    download in 4 MiB range requests, one after another (an object listed at a commit cannot
    change: there the size check after it is enough). A restarted transfer (gcsfs retries
    within one call) sets the size again, which starts the count again (and `pace`'s window,
    as its count goes back).
    """

    def __init__(self, size: int, bar: Progress | None, pace: Pace) -> None:
        super().__init__()
        self.listed = size
        self.bar = bar
        self.pace = pace

    def set_size(self, size: int | None) -> None:
        self.pace.begin()  # a restart is told by the count going back (adlfs sets the size
        self.value = 0  # before each part's count: a restart then would judge nothing)
        super().set_size(size)

    def call(self, *args: Any, **kwargs: Any) -> None:
        if self.value > self.listed:
            raise _PastListedSize
        self.pace.check(int(self.value))
        if self.bar is not None:
            self.bar.set(int(self.value), total=None if self.size is None else int(self.size))
