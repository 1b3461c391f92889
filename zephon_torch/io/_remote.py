"""Shards on any fsspec file system (s3://, gs://, az://, memory://, ...), read through the cache.

Opening lists the objects once (size and etag or mtime per shard) and counts rows from as little
as it can: a Parquet footer by range reads; JSONL (and other formats) need the whole file, so
the shard is downloaded into the node-local cache first. Reading a shard downloads it whole into
the cache (see `_shard_cache`) and hands the local file to the format's ordinary local reader,
so rows read at local speed. The reader pickles as its settings and shard table only; a worker
rebuilds the file system, the cache handle and the local reader on first use. Every remote call
is retried under the `RetryPolicy`, then fails with a StorageError naming the URL.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec.callbacks

from zephon_torch._progress import Progress
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io._discover import GLOB_CHARS, SKIPPED_PREFIXES, detect_files
from zephon_torch.io._projection import Projection
from zephon_torch.io._retry import RetryPolicy, call_with_retry
from zephon_torch.io._rows import Rows
from zephon_torch.io._shard_cache import CachedObject, ShardCache
from zephon_torch.io.formats import INDEX_FILE, ShardReader, make_reader

T = TypeVar("T")

_VERSION_KEYS = ("ETag", "etag", "md5Hash", "LastModified", "last_modified", "mtime", "updated")


@dataclass(frozen=True, kw_only=True)
class CacheOptions:
    """The node-local shard cache.

    Args:
        dir: the cache folder; None means `$ZEPHON_TORCH_CACHE/shards`, else
            `~/.cache/zephon_torch/shards`. Share it between the ranks of a node.
        max_bytes: the most bytes of shards it holds (default 64 GiB); least recently used
            shards not in use are evicted to stay under it.
        prefetch_bytes: the most bytes of prefetches queued at once; None means a quarter of
            `max_bytes`.
        prefetch_threads: background download threads per process.
        enabled: accepted for the pipeline's `{"cache": {"enabled": True}}`; remote shards
            always go through the cache, so False is refused.
    """

    dir: str | None = None
    max_bytes: int = 64 << 30
    prefetch_bytes: int | None = None
    prefetch_threads: int = 2
    enabled: bool = True

    def __post_init__(self) -> None:
        for name in ("max_bytes", "prefetch_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"cache `{name}` must be a positive int, got {value!r}")
        if self.prefetch_bytes is not None and (
            isinstance(self.prefetch_bytes, bool)
            or not isinstance(self.prefetch_bytes, int)
            or self.prefetch_bytes < 0
        ):
            raise ConfigError(
                f"cache `prefetch_bytes` must be an int >= 0 or None, got {self.prefetch_bytes!r}"
            )
        if self.enabled is not True:
            raise ConfigError(
                f"cache `enabled` must be True: remote shards are read through the node-local "
                f"cache, got {self.enabled!r}"
            )

    @property
    def directory(self) -> str:
        """The cache folder, resolved."""
        root = os.environ.get("ZEPHON_TORCH_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "zephon_torch"
        )
        return os.path.abspath(os.path.expanduser(self.dir or os.path.join(root, "shards")))


@dataclass(frozen=True, kw_only=True)
class IoOptions:
    """Storage settings of `Dataset.from_path`, built from its `io_options` mapping.

    Args:
        cache: the shard cache (`{"dir", "max_bytes", "prefetch_bytes", "prefetch_threads"}`).
        retry: the retry policy (`{"attempts", "initial_delay", "max_delay", "timeout"}`).
    """

    cache: CacheOptions = field(default_factory=CacheOptions)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def of(cls, options: Mapping[str, Any] | IoOptions | None) -> IoOptions:
        """Validates an `io_options` mapping; unknown keys raise ConfigError listing the known."""
        if options is None:
            return cls()
        if isinstance(options, IoOptions):
            return options
        if not isinstance(options, Mapping):
            raise ConfigError(f"`io_options` must be a mapping or None, got {options!r}")
        _check_keys("io_options", options, ("cache", "retry"))
        cache = options.get("cache") or {}
        retry = options.get("retry") or {}
        _check_keys("io_options['cache']", cache, tuple(CacheOptions.__dataclass_fields__))
        _check_keys("io_options['retry']", retry, tuple(RetryPolicy.__dataclass_fields__))
        return cls(cache=CacheOptions(**cache), retry=RetryPolicy(**retry))


def _check_keys(what: str, given: Any, known: tuple[str, ...]) -> None:
    if not isinstance(given, Mapping):
        raise ConfigError(f"`{what}` must be a mapping, got {given!r}")
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            f"`{what}` has unknown keys {unknown}; known keys are {', '.join(sorted(known))}"
        )


def is_remote(path: str) -> bool:
    """Whether `path` is a URL other than `file://` (and not `hf://`, resolved apart)."""
    return "://" in path and not path.startswith(("file://", "hf://"))


def list_remote(
    url: str,
    *,
    format_: str | None,
    storage_options: Mapping[str, Any],
    retry: RetryPolicy,
) -> tuple[str, list[tuple[str, CachedObject]]]:
    """Lists the data objects a remote URL names and decides their format.

    Returns:
        The format and, sorted by path, each object's file-system path and cache identity.

    Raises:
        ConfigError: as `find_files` does, and for MDS/LitData directories (not yet remote).
        StorageError: when listing fails after retries.
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as error:
        raise ImportError(
            f"reading {url!r} needs its fsspec back end: {error}; for s3://, gs:// and az:// "
            "install 'zephon-torch[cloud]'"
        ) from error
    except ValueError as error:
        raise ConfigError(f"cannot open {url!r}: {error}") from error

    def listing() -> tuple[str, dict[str, dict[str, Any]]]:
        if GLOB_CHARS.intersection(root):
            return "glob", fs.glob(root, detail=True)
        if fs.isdir(root):
            return "directory", fs.find(root, detail=True)
        if fs.isfile(root):
            return "file", {root: fs.info(root)}
        raise ConfigError(f"no files found at {url!r}: the path does not exist")

    where, found = call_with_retry(listing, url=url, policy=retry, what="listing")
    base = root.rstrip("/")
    infos: dict[str, dict[str, Any]] = {}
    for path, info in found.items():
        if info.get("type", "file") != "file":
            continue
        relative = path[len(base) :].lstrip("/") if path.startswith(base) else path
        if where == "directory" and any(
            part.startswith(SKIPPED_PREFIXES) for part in relative.split("/")
        ):
            continue
        infos[path] = info
    if (where == "directory" and f"{base}/{INDEX_FILE}" in infos) or root.endswith(INDEX_FILE):
        raise ConfigError(
            f"{url!r} is an MDS/LitData directory: reading these from remote storage is not "
            "supported yet; copy it to local disk"
        )
    if not infos:
        raise ConfigError(f"no files found at {url!r}: the {where} holds no visible files")
    paths = sorted(infos)
    if format_ is None:
        format_, paths = detect_files(url, where, paths)
    objects = [(path, _identity(fs, path, infos[path])) for path in paths]
    return format_, objects


def _identity(fs: Any, path: str, info: Mapping[str, Any]) -> CachedObject:
    version = next((str(info[key]) for key in _VERSION_KEYS if info.get(key)), "")
    if not version and info.get("created") is not None:
        version = str(info["created"])
    return CachedObject(url=fs.unstrip_protocol(path), size=int(info["size"]), version=version)


class RemoteReader:
    """A `ShardReader` over remote shards: downloads each into the cache, reads it locally.

    Shard paths are URLs. Thread-safe; pickles as its settings and shard table.

    Args:
        dataset: the dataset name, used in error messages.
        format_: the shards' format (not an indexed one).
        url: the URL the dataset was opened from; its protocol picks the file system.
        objects: each shard's file-system path and cache identity.
        storage_options: passed to the fsspec file system.
        options: cache and retry settings.
        index_cache_dir: where JSONL line indexes of cached shards are kept.
        projection: the columns rows keep, as for local readers.
    """

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
    ) -> None:
        self.dataset = dataset
        self.format = format_
        self.url = url
        self.objects = {item.url: (path, item) for path, item in objects}
        self.storage_options = dict(storage_options)
        self.options = options
        self.index_cache_dir = index_cache_dir
        self.projection = projection or Projection()
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._fs: Any = None
        self._cache: ShardCache | None = None
        self._local: ShardReader = make_reader(
            self.format,
            dataset=self.dataset,
            index_cache_dir=self.index_cache_dir,
            projection=self.projection,
        )
        self._pool: ThreadPoolExecutor | None = None
        self._queued: dict[str, int] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        keys = ("dataset", "format", "url", "objects", "storage_options", "options")
        return {key: self.__dict__[key] for key in (*keys, "index_cache_dir", "projection")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def shard_urls(self) -> list[str]:
        """The shard URLs, in order."""
        return list(self.objects)

    def num_rows(self, path: str) -> int:
        """Counts a shard's rows: a Parquet footer by range reads, else from the cached file."""
        fs_path, item = self.objects[path]
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            def footer() -> int:
                with self._filesystem().open(fs_path, "rb") as handle:
                    try:
                        return int(pq.ParquetFile(handle).metadata.num_rows)
                    except pa.ArrowInvalid as error:  # bad bytes; I/O errors are retried
                        raise DataError(
                            f"not a readable Parquet file: {error}",
                            dataset=self.dataset,
                            shard=path,
                        ) from error

            return call_with_retry(
                footer, url=path, policy=self.options.retry, what="reading the footer"
            )
        with self._shard_cache().open(item, self._downloader(fs_path, item)) as local:
            return self._renamed(lambda: self._local.num_rows(local), path)

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns rows of the shard at URL `path`, downloading it into the cache if needed."""
        fs_path, item = self.objects[path]
        with self._shard_cache().open(item, self._downloader(fs_path, item)) as local:
            return self._renamed(lambda: self._local.read(local, rows), path)

    def prefetch(self, urls: Iterable[str]) -> None:
        """Queues background downloads of these shards; returns at once.

        Requests past the prefetch byte bound, or for shards already queued, are dropped: the
        read downloads them itself. Errors are not raised here; the read retries and raises.
        """
        cache_options = self.options.cache
        budget = cache_options.prefetch_bytes
        if budget is None:
            budget = cache_options.max_bytes // 4
        with self._lock:
            if self._pid != os.getpid():
                self._pool, self._queued, self._pid = None, {}, os.getpid()
            for url in urls:
                fs_path, item = self.objects[url]
                if url in self._queued or sum(self._queued.values()) + item.size > budget:
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=cache_options.prefetch_threads,
                        thread_name_prefix="zephon-prefetch",
                    )
                self._queued[url] = item.size
                self._pool.submit(self._prefetch_one, url, fs_path, item)

    def _prefetch_one(self, url: str, fs_path: str, item: CachedObject) -> None:
        # Errors are dropped: the read that needs the shard downloads it and raises them.
        try:
            with contextlib.suppress(Exception):
                download = self._downloader(fs_path, item, show=False)
                self._shard_cache().ensure(item, download, pin=False)
        finally:
            with self._lock:
                self._queued.pop(url, None)

    def _renamed(self, call: Callable[[], T], url: str) -> T:
        """Runs a local-reader call, naming the URL rather than the cached file in errors."""
        try:
            return call()
        except DataError as error:
            raise DataError(error.detail, dataset=self.dataset, shard=url, row=error.row) from (
                error
            )

    def _downloader(self, fs_path: str, item: CachedObject, *, show: bool = True) -> Any:
        """The download of one shard, retried; a foreground one shows a byte bar on a
        terminal (prefetches stay quiet: several run at once in the background)."""

        def download(target: str) -> None:
            def attempt() -> None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
                name = f"downloading {os.path.basename(fs_path)}"
                with Progress(item.size if show else 0, name) as bar:
                    callback = _BarCallback(bar) if show and bar.active else None
                    if callback is None:
                        self._filesystem().get_file(fs_path, target)
                    else:
                        self._filesystem().get_file(fs_path, target, callback=callback)
                got = os.path.getsize(target)
                if got != item.size:
                    raise OSError(f"truncated download: {got} of {item.size} bytes")

            call_with_retry(attempt, url=item.url, policy=self.options.retry, what="download")

        return download

    def _filesystem(self) -> Any:
        with self._lock:
            if self._fs is None:
                import fsspec

                self._fs = fsspec.core.url_to_fs(self.url, **self.storage_options)[0]
            return self._fs

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

    def _shard_cache(self) -> ShardCache:
        with self._lock:
            if self._cache is None:
                cache = self.options.cache
                self._cache = ShardCache(cache.directory, cache.max_bytes)
            return self._cache


class _BarCallback(fsspec.callbacks.Callback):  # type: ignore[misc]
    """Feeds fsspec's transfer progress to a terminal bar."""

    def __init__(self, bar: Progress) -> None:
        super().__init__()
        self.bar = bar

    def call(self, *args: Any, **kwargs: Any) -> None:
        self.bar.set(int(self.value), total=None if self.size is None else int(self.size))
