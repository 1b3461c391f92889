"""Remote shards read through the node-local cache by the format's ordinary local reader.

Reading a shard downloads it whole into the cache (see `_shard_cache`), so rows read at local
speed; the downloads, and prefetches of the shards read next, are `_shard_downloads`'s. JSONL,
Parquet and Vortex readers are handed the cached file; MDS, LitData and `.npy` readers, whose
shards come with an index or an offsets file, reach every file through a `locate` hook that
downloads it (see `_locate`). Rows are counted from as little as can be: MDS and LitData from
`index.json`, Parquet footers and `.npy` headers by range reads; JSONL (and Vortex) need the
whole file once, after which the count is remembered (see `_remote_rows`). The reader pickles
as its settings and object table; a worker rebuilds the file system, the cache handle and the
local reader on first use. Every remote call is retried under the `RetryPolicy`, then fails
with a StorageError naming the URL; an object changed or gone since its listing is a DataError
naming the shard (see `_download.read_listed`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from zephon_torch._weak import weakly
from zephon_torch.errors import ConfigError, DataError, StorageError, ZephonError
from zephon_torch.io._arrow import check_columns
from zephon_torch.io._filesystems import open_filesystem
from zephon_torch.io._hashes import HashMismatch
from zephon_torch.io._index import missing_shard
from zephon_torch.io._io_options import IoOptions
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import TOKENS_FIELD, ColumnMismatch, Projection
from zephon_torch.io._remote_rows import (
    SCHEMA_FORMATS,
    Layout,
    counted_columns,
    listed_parquet_layout,
    npy_rows,
    remember_layout,
    remembered_layout,
)
from zephon_torch.io._remote_sizing import max_open
from zephon_torch.io._rows import Rows, TokenIds, where_in_file
from zephon_torch.io._shard_cache import CachedObject, ShardCache
from zephon_torch.io._shard_downloads import ShardDownloads
from zephon_torch.io.formats import LOCATING_FORMATS, ShardReader, open_reader, token_reader
from zephon_torch.io.npy import offsets_path
from zephon_torch.io.parquet import window_blocks

T = TypeVar("T")
# what a prefetch still queued when its remote dataset was let go meets (logged, dropped)
_GONE = "the remote dataset's reader is gone"


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
        companions: objects read beside those the URL named (see `Listing`): no shards.
    """

    _fs: Any
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
        "companions",
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
        companions: frozenset[str] = frozenset(),
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
        self.companions = companions
        self._open_caches()
        self._fs = fs  # the listing's, reused in this process only
        self.downloads.index_data = index_data

    def _open_caches(self) -> None:
        self._fs = None
        self._cache: ShardCache | None = None
        self._opened: tuple[ShardReader, list[str]] | None = None
        self._fresh_locks()
        self.downloads = ShardDownloads(
            dataset=self.dataset,
            objects=self.objects,
            options=self.options,
            files_of=weakly(self._files_of, gone=_GONE),
            filesystem=weakly(self._filesystem, gone=_GONE),
            shard_cache=weakly(self._shard_cache, gone=_GONE),
            index=self.index,
        )
        _LIVE.add(self)

    def _fresh_locks(self) -> None:
        self._lock = threading.Lock()  # makes the file system and the cache handle
        self._opening = threading.Lock()  # builds the local reader; may download the index

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker): fresh locks, as a parent thread may have
        held one at the fork; no download threads (they stayed in the parent); a new file
        system, as its event loop stayed there too."""
        self._fresh_locks()
        self.downloads.after_fork()
        self._fs = None
        if self._cache is not None:
            self._cache.after_fork()

    def with_settings(self, **changes: Any) -> RemoteReader:
        """As `PickledAsSettings.with_settings` (other cache and retry `options`, say), sharing
        this reader's file system where the URL and storage options stay: a pipeline narrows
        its datasets to the fields it reads, and each copy made its own client (an S3 one:
        0.1-0.2 s of CPU) at its first read."""
        clone = super().with_settings(**changes)
        if clone.url == self.url and clone.storage_options == self.storage_options:
            clone._fs = self._fs
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
        return remembered_layout(index_cache_dir, item, self.format)

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
                layout = self._with_reader(path, counted_columns)
            else:
                layout = self._with_reader(path, lambda r, local: r.num_rows(local)), (), ()
            remember_layout(self.index_cache_dir, item, self.format, *layout)
        rows, groups, columns = layout
        if schema:  # the columns asked for, checked at the open as for a local shard
            check_columns(self.projection, columns, dataset=self.dataset, shard=path)
        return rows, window_blocks(groups)

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns rows of the shard at URL `path`, downloading it into the cache if needed."""
        return self._with_reader(path, lambda reader, local: reader.read(local, rows))

    def read_tokens(self, path: str, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """As `read`, the rows' token ids where the local reader gives them (`TokenReader`);
        None at once for the others (Parquet, JSONL, Vortex), before any download."""
        reader = token_reader(self._open()[0])
        if reader is None:
            return None
        return self._with_reader(path, lambda _, local: reader.read_tokens(local, rows, field))

    def maps_token_ids(self) -> bool:
        """Never: the maps are of cached copies, whose disk space an eviction frees only once
        no view of them is held."""
        return False

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
            self.downloads.mark_used(path)
            return call(reader, path)
        fs_path, item = self.objects[path]
        cache = self._shard_cache()
        with cache.open(item, self.downloads.downloader(fs_path, item)) as local:
            try:
                return call(reader, local)
            except DataError as error:
                if cache.lost(item):
                    raise _LostCopy(local, error, self.dataset) from error
                kind = ColumnMismatch if isinstance(error, ColumnMismatch) else DataError
                raise kind(
                    error.detail,
                    dataset=self.dataset,
                    shard=path,
                    row=error.row,
                    shard_wide=error.shard_wide,
                ) from error
            except ConfigError as error:  # the cache too small to decompress it: name the URL
                raise ConfigError(str(error).replace(local, path)) from error
            except StorageError as error:
                url = path if error.url is None else error.url.replace(local, path)
                raise StorageError(error.detail.replace(local, path), url=url) from error

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
                named = [url for url in self.objects if url not in self.companions]
                files = [self.index] if self.index is not None else named
                reader, shards = open_reader(
                    self.format,
                    files,
                    dataset=self.dataset,
                    index_cache_dir=self.index_cache_dir,
                    projection=self.projection,
                    locate=weakly(self._locate, gone=_GONE),
                    max_open=max_open(self.objects, self.options.cache),
                    row_group_cache_bytes=self.options.parquet.row_group_cache_bytes,
                    cache=self.options.cache,
                    verify_hashes=self.options.mds.verify_hashes,
                )
                missing = [shard for shard in shards if shard not in self.objects]
                if missing:
                    raise missing_shard(missing[0], dataset=self.dataset)
                self._opened = reader, shards
            return self._opened

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
            with cache.open(item, self.downloads.downloader(fs_path, item)) as local:
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
        """From the footer by range reads, then checked to be the listed version still (see
        `listed_parquet_layout`)."""
        fs, retry = self._filesystem(), self.options.retry
        return listed_parquet_layout(path, self.objects, fs=fs, policy=retry, dataset=self.dataset)

    def _npy_rows(self, path: str) -> int:
        """From the `.npy` headers when they tell (see `npy_rows`), else from the files; the
        columns asked for checked first, as a local open does (`NpyReader`)."""
        self.projection.check_available([TOKENS_FIELD], dataset=self.dataset, shard=path)
        fs, retry = self._filesystem(), self.options.retry
        objects, companions = self.objects, self.companions
        rows = npy_rows(
            path, objects, fs=fs, policy=retry, dataset=self.dataset, companions=companions
        )
        return self._open()[0].num_rows(path) if rows is None else rows

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


_LIVE: weakref.WeakSet[RemoteReader] = weakref.WeakSet()


def _reset_in_child() -> None:
    for reader in list(_LIVE):
        reader.after_fork()


os.register_at_fork(after_in_child=_reset_in_child)
