"""Remote shards read through the node-local cache by the format's ordinary local reader.

Reading a shard downloads it whole into the cache (see `_shard_cache`), so rows read at local
speed. JSONL, Parquet and Vortex readers are handed the cached file; MDS, LitData and `.npy`
readers, whose shards come with an index or an offsets file, reach every file through a
`locate` hook that downloads it (see `_locate`). Rows are counted from as little as can be:
MDS and LitData from `index.json`, Parquet footers and `.npy` headers by range reads; JSONL
(and Vortex) need the whole file once, after which the count is remembered (see
`_remote_rows`). The reader pickles as its settings and object
table; a worker rebuilds the file system, the cache handle and the local reader on first use.
Every remote call is retried under the `RetryPolicy`, then fails with a StorageError naming the
URL; an object changed or gone since its listing is a DataError naming the shard (see
`_download.read_listed`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

from zephon_torch.errors import ConfigError, DataError, StorageError, ZephonError
from zephon_torch.io._arrow import check_columns
from zephon_torch.io._background import Background
from zephon_torch.io._cache_folder import disk_size
from zephon_torch.io._download import check_unchanged, fetch, read_listed
from zephon_torch.io._hashes import HashMismatch
from zephon_torch.io._index import missing_shard
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import Projection
from zephon_torch.io._remote import IoOptions, open_filesystem
from zephon_torch.io._remote_rows import (
    SCHEMA_FORMATS,
    Layout,
    npy_rows,
    parquet_layout,
    remember_layout,
    remembered_layout,
)
from zephon_torch.io._rows import Rows, TokenIds, where_in_file
from zephon_torch.io._shard_cache import CachedObject, ShardCache
from zephon_torch.io.formats import (
    COMPRESSION_ENDINGS,
    LOCATING_FORMATS,
    ShardReader,
    open_reader,
    token_reader,
)
from zephon_torch.io.npy import offsets_path
from zephon_torch.io.parquet import window_blocks

_log = logging.getLogger(__name__)

T = TypeVar("T")

_MAPPED_SHARE = 8  # shards kept open by a local reader take at most max_bytes / this
_MIN_OPEN, _MAX_OPEN = 2, 16
_INFLATION = 8  # a compressed JSONL shard's decompressed size, in its sizes, as the open guesses


class RemoteReader(PickledAsSettings):
    """A `ShardReader` over remote shards: downloads each into the cache, reads it locally.

    Shard paths are URLs. Thread-safe; pickles as its settings and object table.

    Args:
        dataset: the dataset name, used in error messages.
        format_: the shards' format.
        url: the URL the dataset was opened from; its protocol picks the file system.
        objects: each object's file-system path and cache identity: the shards, `.npy`
            offsets files, and for MDS and LitData the index and its shards.
        storage_options: passed to the fsspec file system.
        options: cache and retry settings.
        index_cache_dir: where JSONL line indexes of cached shards, and remembered row counts,
            are kept.
        projection: the columns rows keep, as for local readers.
        index: the URL of the `index.json` of an MDS or LitData dataset.
        index_data: that index's bytes when the caller has read them already: the cache
            takes them instead of downloading the index again (not pickled).
        fs: the fsspec file system, when the caller has one already (not pickled).
    """

    _fs: Any
    _index_data: bytes | None
    SETTINGS = (  # what it pickles as
        "dataset",
        "format",
        "url",
        "objects",
        "storage_options",
        "options",
        "index_cache_dir",
        "projection",
        "index",
    )

    def __init__(
        self,
        *,
        dataset: str,
        format_: str,
        url: str,
        objects: Iterable[tuple[str, CachedObject]],
        storage_options: Mapping[str, Any],
        options: IoOptions,
        index_cache_dir: str,
        projection: Projection | None = None,
        index: str | None = None,
        index_data: bytes | None = None,
        fs: Any = None,
    ) -> None:
        self.dataset = dataset
        self.format = format_
        self.url = url
        self.objects = {item.url: (path, item) for path, item in objects}
        self.storage_options = dict(storage_options)
        self.options = options
        self.index_cache_dir = index_cache_dir
        self.projection = projection or Projection()
        self.index = index
        self._open_caches()
        self._fs = fs  # the listing's, reused in this process only
        self._index_data = index_data

    def _open_caches(self) -> None:
        self._fs = None
        self._index_data = None
        self._cache: ShardCache | None = None
        self._opened: tuple[ShardReader, list[str]] | None = None
        self._budget_warned = False
        self._window_warned = False
        self._fresh_threads()
        _LIVE.add(self)

    def _fresh_threads(self) -> None:
        self._lock = threading.Lock()
        self._opening = threading.Lock()  # builds the local reader; may download the index
        self._pool: Background | None = None
        self._queued: set[str] = set()
        # per object, how its last prefetch failed or stopped (see `_downloader`)
        self._failed: dict[str, _Failed] = {}
        # set by a download that failed (not stopped), cleared by one that succeeds in the
        # foreground: meanwhile no prefetch is queued, and those running stop retrying
        self._store_failed = threading.Event()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker): fresh locks, as a parent thread may have
        held one at the fork; no download threads (they stayed in the parent); a new file
        system, as its event loop stayed there too."""
        self._fresh_threads()
        self._fs = None
        if self._cache is not None:
            self._cache.after_fork()

    def with_options(self, options: IoOptions) -> RemoteReader:
        """A reader of the same shards with other cache and retry settings."""
        clone = RemoteReader.__new__(RemoteReader)
        clone.__setstate__({**self.__getstate__(), "options": options})
        return clone

    @property
    def shard_urls(self) -> list[str]:
        """The shard URLs, in order: the listing's, or those `index.json` lists.

        Raises:
            DataError: for a shard that `index.json` lists and the listing lacks.
        """
        return list(self._open()[1])

    def unremembered(self, index_cache_dir: str) -> list[str] | None:
        """The shards (one-object formats: Parquet, JSONL, Vortex) whose row count is not
        remembered in `index_cache_dir`; None when this open remembers none there (objects
        listed without a version are counted at every open)."""
        if os.path.abspath(self.index_cache_dir) != os.path.abspath(index_cache_dir):
            return None
        return [
            url
            for url in self.shard_urls
            if self._remembered(index_cache_dir, self.objects[url][1]) is None
        ]

    def _remembered(self, index_cache_dir: str, item: CachedObject) -> Layout | None:
        """The layout `index_cache_dir` remembers for this version of the object (see
        `remembered_layout`), with what this format keeps."""
        parquet = self.format == "parquet"
        schema = self.format in SCHEMA_FORMATS
        return remembered_layout(index_cache_dir, item, parquet=parquet, schema=schema)

    def num_rows(self, path: str) -> int:
        """Counts a shard's rows (see `shard_layout`)."""
        return self.shard_layout(path)[0]

    def shard_layout(self, path: str) -> tuple[int, tuple[int, ...]]:
        """A shard's row count and window blocks (Parquet; see `parquet.window_blocks`):
        from `index.json`, a Parquet footer or `.npy` headers by range reads, else from the
        downloaded file. A one-object count (Parquet, JSONL, Vortex) is remembered in the index
        cache folder, keyed by the object's URL, size and version, so a later open (a restart,
        another worker, rank or node sharing the folder) reads nothing but the listing."""
        if self.format == "npy":  # two objects: read from their headers each time
            return self._npy_rows(path), ()
        if self.format in LOCATING_FORMATS:
            return self._with_reader(path, lambda reader, local: reader.num_rows(local)), ()
        item = self.objects[path][1]
        schema = self.format in SCHEMA_FORMATS
        layout = self._remembered(self.index_cache_dir, item)
        if layout is None:
            if self.format == "parquet":
                layout = self._parquet_layout(path)
            elif schema:
                layout = self._with_reader(path, _counted_columns)
            else:
                layout = self._with_reader(path, lambda r, local: r.num_rows(local)), (), ()
            remember_layout(self.index_cache_dir, item, *layout)
        rows, groups, columns = layout
        if schema:  # the columns asked for, checked at the open as for a local shard
            check_columns(self.projection, columns, dataset=self.dataset, shard=path)
        return rows, window_blocks(groups)

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns rows of the shard at URL `path`, downloading it into the cache if needed."""
        return self._with_reader(path, lambda reader, local: reader.read(local, rows))

    def read_tokens(self, path: str, rows: Rows, field: str) -> list[TokenIds] | None:
        """As `read`, the rows' token ids where the local reader gives them (`TokenReader`);
        None at once for the others (Parquet, JSONL, Vortex), before any download."""
        reader = token_reader(self._open()[0])
        if reader is None:
            return None
        return self._with_reader(path, lambda _, local: reader.read_tokens(local, rows, field))

    def line_of(self, path: str, row: int) -> str | None:
        """The local reader's place of the row in the cached copy (`where_in_file`); None
        where that copy cannot be had now."""
        if path not in self.objects or not hasattr(self._open()[0], "line_of"):
            return None  # a shard of another dataset's (a user's error may name any)
        try:
            return self._with_reader(path, lambda reader, local: where_in_file(reader, local, row))
        except (ZephonError, OSError):
            return None

    def _with_reader(self, path: str, call: Callable[[ShardReader, str], T]) -> T:
        """Runs `call(local reader, shard path)`: the URL for readers that locate their files
        (they download what they need), else the cached file, naming the URL in errors. A
        read that failed as the node's cached copy was deleted under it (a tmp cleaner; the
        object is not at fault) is made once more, downloading it again.

        Raises:
            StorageError: when the copy was deleted under that second read too.
        """
        try:
            return self._read_once(path, call)
        except _LostCopy:
            pass
        try:
            return self._read_once(path, call)
        except _LostCopy as error:
            raise StorageError(
                f"{error.detail}, and again under the read made once more: point io_options "
                "cache `dir` at a folder no cleaner deletes",
                url=path,
            ) from error

    def _read_once(self, path: str, call: Callable[[ShardReader, str], T]) -> T:
        reader = self._open()[0]
        if self.format in LOCATING_FORMATS:
            self._mark_used(path)
            return call(reader, path)
        fs_path, item = self.objects[path]
        cache = self._shard_cache()
        with cache.open(item, self._downloader(fs_path, item)) as local:
            try:
                return call(reader, local)
            except DataError as error:
                if cache.lost(item):
                    raise _LostCopy(local, error, self.dataset) from error
                raise DataError(
                    error.detail, dataset=self.dataset, shard=path, row=error.row
                ) from error
            except ConfigError as error:  # the cache too small to decompress it: name the URL
                raise ConfigError(str(error).replace(local, path)) from error
            except StorageError as error:
                url = path if error.url is None else error.url.replace(local, path)
                raise StorageError(error.detail.replace(local, path), url=url) from error

    def prefetch(self, urls: Iterable[str], *, share: int = 1) -> None:
        """Downloads upcoming shards (and their `.npy` offsets files) in the background, as far
        ahead as the cache's `prefetch_bytes` reaches; returns at once.

        `urls` are the shards in the order they will be read, the one being read first. The
        walk adds up the sizes of those after it, cached or not, and stops before the sum
        passes the budget (but always takes the next one), so at most `prefetch_bytes` of data,
        or one shard, lies ready ahead of the reader however often it asks;
        objects already queued are skipped, and those already cached are marked as just used
        (else a shard fetched ahead looks older to the LRU than those other processes read
        since, and is evicted before its turn). It consumes `urls` lazily. `share`: how
        many datasets prefetch into this cache at once; each gets that part of the budget, so
        together they stay within it. Errors are not raised here; the read that needs the
        shard retries and raises them. Nothing is fetched ahead after a download from the store
        failed, until a read's download succeeds (see `_downloader`).
        """
        cache_options = self.options.cache
        budget = cache_options.prefetch_bytes
        if budget == 0 or self._store_failed.is_set():
            return
        processes = local_processes()
        if budget is None:  # a quarter of the cache for all the node's processes together
            budget = cache_options.max_bytes // 4 // processes
        elif budget > cache_options.max_bytes // 2 // processes:
            budget = self._shared_budget(budget, processes)
        budget //= max(1, share)
        cache = self._shard_cache()
        ahead = 0
        with self._lock:
            for number, shard in enumerate(urls):
                # the shard being read is not ahead, and the next one is always fetched (a
                # small budget, many processes to a node, would else fetch nothing)
                if number > 0:
                    ahead += sum(self.objects[url][1].size for url in self._files_of(shard))
                    if number > 1 and ahead > budget:
                        return
                self._fetch_ahead(shard, cache)

    def check_window(self, shards: list[str], *, share: int = 1) -> None:
        """See `Dataset.check_window`."""
        if self._window_warned:
            return
        size = sum(self.objects[url][1].size for shard in shards for url in self._files_of(shard))
        max_bytes = self.options.cache.max_bytes
        room = max_bytes // max(1, share)
        if size > room:
            self._window_warned = True
            part = f"its part ({room} bytes) of " if share > 1 else ""
            shared = f", shared by {share} remote datasets" if share > 1 else ""
            warnings.warn(
                f"dataset {self.dataset!r}: the {len(shards)} shards of a shuffle window "
                f"({size} bytes, read at once) do not fit in {part}the shard cache (max_bytes "
                f"{max_bytes}{shared}), so they are downloaded again and again as their rows "
                f"are read; raise `max_bytes` or lower `shuffle_window_shards`",
                stacklevel=2,
            )

    def _shared_budget(self, budget: int, processes: int) -> int:
        """The part of half the cache each of the node's `processes` may prefetch, where
        `budget` each would pass it (warned of once per dataset and process): more evicts
        prefetched shards before they are read, which are then downloaded again."""
        shared = self.options.cache.max_bytes // 2 // processes
        if not self._budget_warned:
            self._budget_warned = True
            warnings.warn(
                f"dataset {self.dataset!r}: cache `prefetch_bytes` {budget} per process, for "
                f"{processes} processes on this node, passes half of `max_bytes` "
                f"({self.options.cache.max_bytes}); each prefetches {shared} bytes ahead",
                stacklevel=3,
            )
        return shared

    def _mark_used(self, shard: str) -> None:
        """Marks the cached files of a shard read through a reader that keeps it open as just
        used (once per read call, a window of rows): the reader goes back to the cache only
        when it opens the shard, so a shard read all the time would else look the oldest to
        the LRU, be evicted first and downloaded again by the node's other processes."""
        cache = self._shard_cache()
        for url in self._files_of(shard):
            cache.touch(self.objects[url][1])  # not cached (yet, or any more): nothing to mark

    def _fetch_ahead(self, shard: str, cache: ShardCache) -> None:
        """Under the lock: queue the download of the shard's uncached files."""
        cache_options = self.options.cache
        for url in self._files_of(shard):
            fs_path, item = self.objects[url]
            # cached: marked as just used, so that the LRU does not evict it first
            if url in self._queued or cache.touch(item):
                continue
            if self._pool is None:
                self._pool = Background(cache_options.prefetch_threads, "zephon-prefetch")
            self._queued.add(url)
            self._pool.submit(self._prefetch_one, url, fs_path, item)

    def cache_counters(self) -> dict[str, int]:
        """This process's cache hits, misses and bytes downloaded for this dataset."""
        cache = self._cache
        if cache is None:
            return {"hits": 0, "misses": 0, "bytes_downloaded": 0}
        return {
            "hits": cache.hits,
            "misses": cache.misses,
            "bytes_downloaded": cache.bytes_downloaded,
        }

    def _open(self) -> tuple[ShardReader, list[str]]:
        """The local reader and the shard URLs, built once (reading `index.json` for MDS and
        LitData)."""
        with self._opening:
            if self._opened is None:
                files = [self.index] if self.index is not None else list(self.objects)
                reader, shards = open_reader(
                    self.format,
                    files,
                    dataset=self.dataset,
                    index_cache_dir=self.index_cache_dir,
                    projection=self.projection,
                    locate=self._locate,
                    max_open=self._max_open(),
                    row_group_cache_bytes=self.options.parquet.row_group_cache_bytes,
                    cache=self.options.cache,
                    verify_hashes=self.options.mds.verify_hashes,
                )
                missing = [shard for shard in shards if shard not in self.objects]
                if missing:
                    raise missing_shard(missing[0], dataset=self.dataset)
                self._opened = reader, shards
            return self._opened

    def opening_threads(self, most: int) -> int:
        """How many shards the open counts at once: `most`, or fewer for JSONL, whose count
        downloads each shard whole and decompresses a compressed one into the cache (taken
        as `_INFLATION` times its size), so that what the counts hold at once fits in the
        cache: more threads, each holding a shard while it waits for room for the next,
        would go past `max_bytes` together and stall, then fall back to memory."""
        if self.format != "jsonl":
            return most
        need = max(
            (
                item.size * (1 + _INFLATION if url.endswith(COMPRESSION_ENDINGS) else 1)
                for url, (_, item) in self.objects.items()
            ),
            default=0,
        )
        return max(1, min(most, self.options.cache.max_bytes // max(need, 1)))

    def _max_open(self) -> int:
        """How many shards the local reader keeps open or mapped between reads. The cache may
        evict such a shard, but its disk space is freed only when the reader lets it go, so
        they are sized to an eighth of `max_bytes`, or of the disk where that is smaller (the
        default 64 GiB on a small disk: 16 evicted shards held open filled it), between 2
        and 16 shards."""
        largest = max((item.size for _, item in self.objects.values()), default=0)
        room = min(self.options.cache.max_bytes, disk_size(self.options.cache.directory))
        fitting = room // _MAPPED_SHARE // max(largest, 1)
        return max(_MIN_OPEN, min(_MAX_OPEN, fitting))

    @contextlib.contextmanager
    def _locate(self, url: str) -> Iterator[str]:
        """Yields the cached file of a listed object, pinned; FileNotFoundError when unlisted.
        A `HashMismatch` raised in the block drops the cached copy (unless another process
        is reading it), so that the next read downloads the object again; an error raised
        there as the copy was deleted under the pin is a `_LostCopy` (see `_with_reader`)."""
        if url not in self.objects:
            raise FileNotFoundError(f"{url} is not in the listing of {self.url}")
        fs_path, item = self.objects[url]
        cache = self._shard_cache()
        try:
            with cache.open(item, self._downloader(fs_path, item)) as local:
                try:
                    yield local
                except (DataError, OSError) as error:
                    if not isinstance(error, HashMismatch) and cache.lost(item):
                        raise _LostCopy(local, error, self.dataset) from error
                    raise
        except HashMismatch:
            cache.discard(item)
            raise

    def _files_of(self, url: str) -> list[str]:
        """The objects a shard reads: itself, and a 1-D `.npy` token file's offsets file."""
        partner = offsets_path(url) if self.format == "npy" else None
        return [url, partner] if partner in self.objects else [url]

    def _parquet_layout(self, path: str) -> Layout:
        """The row count, row-group sizes and columns from the footer, by range reads
        (retried); no download. The reads are not tied to the listed version, so the object
        is then checked to be it still (one HEAD, as after a download): a rewrite between the
        listing and the reads would else be remembered as the listed version's layout, and
        read as such should the object come back to the listed bytes (an S3 ETag is their
        MD5), every pass losing the rows past the rewrite's count.

        Raises:
            DataError: the object changed or went since it was listed, or is not Parquet.
        """
        fs_path, item = self.objects[path]

        def tail(length: int) -> bytes:
            def attempt() -> bytes:
                start = max(0, item.size - length)
                data: bytes = fs.cat_file(fs_path, start=start, end=item.size)
                return data

            retry = self.options.retry
            what = "reading the footer"
            return read_listed(
                attempt, fs, fs_path, item, dataset=self.dataset, retry=retry, what=what
            )

        fs = self._filesystem()
        try:
            layout = parquet_layout(tail, size=item.size, url=path, dataset=self.dataset)
        except DataError:  # a footer cut from a rewrite's bytes: say that it changed
            check_unchanged(fs, fs_path, item, dataset=self.dataset, retry=self.options.retry)
            raise
        check_unchanged(fs, fs_path, item, dataset=self.dataset, retry=self.options.retry)
        return layout

    def _npy_rows(self, path: str) -> int:
        """From the `.npy` headers when they tell (see `npy_rows`), else from the files."""
        fs, retry = self._filesystem(), self.options.retry
        rows = npy_rows(path, self.objects, fs=fs, policy=retry, dataset=self.dataset)
        return self._open()[0].num_rows(path) if rows is None else rows

    def _prefetch_one(self, url: str, fs_path: str, item: CachedObject) -> None:
        # Errors are not raised here: the read that needs the object downloads it and raises
        # them, or this one where it waited on this download (see `_downloader`).
        try:
            if self._store_failed.is_set():  # queued before a download failed
                return
            download = self._downloader(fs_path, item, foreground=False)
            self._shard_cache().ensure(item, download, pin=False)
        except Exception:  # raised again by the read that needs the object
            pass
        finally:
            with self._lock:
                self._queued.discard(url)

    def _downloader(self, fs_path: str, item: CachedObject, *, foreground: bool = True) -> Any:
        """The download of one object, retried; a foreground one shows a byte bar on a
        terminal (prefetches stay quiet: several run at once in the background).

        A download that fails (past its retries, or for good) stops the prefetches: those
        queued are dropped, and those running stop before their next retry, rather than each
        retrying a dead store for the policy's whole `timeout` (and holding its object's
        lock) after the run has its error; prefetching resumes once a foreground download
        succeeds.

        A foreground download that waited on a prefetch of its object (for the object's lock)
        raises at once the `StorageError` of that prefetch if it failed: retrying as long
        again would double the policy's `timeout` against a dead store. If it was stopped,
        the read retries for what was left of the prefetch's `timeout` only (one attempt at
        least): one budget per object, whichever download spends it."""
        asked = time.monotonic() if foreground else None
        stop = None if foreground else self._store_failed

        def download(target: str) -> None:
            retry = self.options.retry
            if asked is not None:
                with self._lock:
                    failed = self._failed.pop(item.url, None)
                if failed is not None and failed.at >= asked:
                    if failed.error.reason != "stopped":
                        error = failed.error
                        raise StorageError(error.detail, url=error.url) from error
                    left = failed.began + retry.timeout - time.monotonic()
                    retry = dataclasses.replace(retry, timeout=max(0.0, left))
            given = self._index_data if item.url == self.index else None
            if given is not None and len(given) == item.size:  # read when listing: no GET
                with open(target, "wb") as handle:
                    handle.write(given)
                return
            began = time.monotonic()
            try:
                fetch(
                    self._filesystem(),
                    fs_path,
                    item,
                    target,
                    dataset=self.dataset,
                    retry=retry,
                    show=foreground,
                    stop=stop,
                )
            except StorageError as error:
                with self._lock:
                    if stop is not None:  # a prefetch: told while it still holds the object's
                        # lock, which a waiting read takes the moment it is let go
                        self._failed[item.url] = _Failed(time.monotonic(), began, error)
                    if error.reason != "stopped":
                        self._stop_prefetching(error)
                raise
            if foreground and self._store_failed.is_set():
                self._store_failed.clear()
                _log.info("dataset %r: a download succeeded; prefetching resumes", self.dataset)

        return download

    def _stop_prefetching(self, error: StorageError) -> None:
        """Under the lock: no prefetch queued or retried until a foreground download succeeds."""
        if not self._store_failed.is_set():
            _log.info(
                "dataset %r: prefetching stops until a read's download succeeds, after: %s",
                self.dataset,
                error,
            )
        self._store_failed.set()
        if self._pool is not None:
            for url, *_ in self._pool.clear():
                self._queued.discard(url)

    def _filesystem(self) -> Any:
        with self._lock:
            if self._fs is None:  # a pickled copy's, made as at the open (`list_remote`)
                self._fs = open_filesystem(self.url, self.storage_options)[0]
            return self._fs

    def _shard_cache(self) -> ShardCache:
        with self._lock:
            if self._cache is None:
                cache = self.options.cache
                self._cache = ShardCache(cache.directory, cache.max_bytes)
            return self._cache


class _LostCopy(DataError):
    """A read failed as the node's cached copy of its shard was deleted (or replaced) under
    its pin, by someone else: `_with_reader` makes it once more."""

    def __init__(self, local: str, error: Exception, dataset: str) -> None:
        super().__init__(
            f"the cached copy {local!r} was deleted under the read ({type(error).__name__}: "
            f"{error})",
            dataset=dataset,
        )


class _Failed(NamedTuple):
    """A prefetch that ended in a StorageError: when, when its download began, the error."""

    at: float
    began: float
    error: StorageError


def local_processes() -> int:
    """How many processes of this node share its shard cache, as far as this one can tell: the
    node's ranks (``LOCAL_WORLD_SIZE``, as torchrun sets it) times this DataLoader's workers."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    loading = sys.modules.get("torch.utils.data")  # loaded already in a DataLoader worker
    info = loading.get_worker_info() if loading is not None else None
    return ranks * (info.num_workers if info is not None else 1)


_LIVE: weakref.WeakSet[RemoteReader] = weakref.WeakSet()


def _reset_in_child() -> None:
    for reader in list(_LIVE):
        reader.after_fork()


os.register_at_fork(after_in_child=_reset_in_child)


def _counted_columns(reader: Any, local: str) -> Layout:
    """A downloaded shard's row count and columns (a Vortex file's)."""
    return reader.num_rows(local), (), reader.columns(local)
