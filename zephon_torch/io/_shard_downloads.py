"""A remote dataset's downloads into the node-local shard cache: a read's, in the foreground,
and prefetches of the shards its reader reads next, in the background.

Prefetches stay within the cache's `prefetch_bytes` (by default a quarter of `max_bytes`, split
between the node's processes and the datasets that prefetch at once) and `AHEAD_PER_THREAD`
shards a download thread, mark cached shards as just used so that the LRU keeps them for their
turn, and stop when a download from the store fails (until a read's download succeeds): a dead
store costs one retry budget, not one per queued shard. Their errors are raised by the read that
needs the object.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from zephon_torch._caller import warn
from zephon_torch.errors import StorageError
from zephon_torch.io._background import Background
from zephon_torch.io._download import fetch
from zephon_torch.io._io_options import IoOptions
from zephon_torch.io._shard_cache import CachedObject, ShardCache

_log = logging.getLogger(__name__)

# The most shards a walk goes ahead, per download thread, whatever the byte budget. Each
# reader walks again at each chunk it takes up, one stat (a `touch`) a shard walked: with tiny
# shards (a document a file) the default budget, 16 GiB, reached past the end of the pass, so
# that every walk marked every shard left and a pass cost O(shards^2) (10,000 shards of 1-3
# rows on 8 lanes: 590,000 stats, a pass 2.5x as long as the same files local). A thread takes
# many seconds to fetch this many objects (two requests each), and the next walk comes sooner.
AHEAD_PER_THREAD = 512


class ShardDownloads:
    """The downloads of one remote dataset's objects (see the module's docstring).

    Args:
        dataset: the dataset name, used in messages.
        objects: each object's URL to its file-system path and cache identity.
        options: cache and retry settings.
        files_of: the objects a shard reads (itself, and a `.npy` token file's offsets file).
        filesystem: the fsspec file system (made on first use).
        shard_cache: the node's shard cache (made on first use).
        index: the URL of an MDS or LitData `index.json`.
        index_data: that index's bytes where read already: its download writes them.
    """

    def __init__(
        self,
        *,
        dataset: str,
        objects: Mapping[str, tuple[str, CachedObject]],
        options: IoOptions,
        files_of: Callable[[str], list[str]],
        filesystem: Callable[[], Any],
        shard_cache: Callable[[], ShardCache],
        index: str | None = None,
        index_data: bytes | None = None,
    ) -> None:
        self.dataset = dataset
        self.objects = objects
        self.options = options
        self._files_of = files_of
        self._filesystem = filesystem
        self._shard_cache = shard_cache
        self.index = index
        self.index_data = index_data
        self._budget_warned = False
        self._window_warned = False
        self.after_fork()

    def after_fork(self) -> None:
        """Fresh locks and no download threads: those stayed in the parent (a DataLoader
        worker's fork), and a parent thread may have held the lock."""
        self._lock = threading.Lock()
        self._pool: Background | None = None
        self._queued: set[str] = set()
        # per object, how its last prefetch failed or stopped (see `downloader`)
        self._failed: dict[str, _Failed] = {}
        # set by a download that failed (not stopped), cleared by one that succeeds in the
        # foreground: meanwhile no prefetch is queued, and those running stop retrying
        self._store_failed = threading.Event()

    def prefetch(self, urls: Iterable[str], *, share: int = 1) -> None:
        """Downloads upcoming shards (and their `.npy` offsets files) in the background, as far
        ahead as the cache's `prefetch_bytes` reaches; returns at once.

        `urls` are the shards in the order they will be read, the one being read first. The
        walk adds up the sizes of those after it, cached or not, and stops before the sum
        passes the budget (but always takes the next one), or at `AHEAD_PER_THREAD` shards a
        download thread, so at most `prefetch_bytes` of data, or one shard, lies ready ahead
        of the reader however often it asks;
        objects already queued are skipped, and those already cached are marked as just used
        (else a shard fetched ahead looks older to the LRU than those other processes read
        since, and is evicted before its turn). It consumes `urls` lazily. `share`: how
        many datasets prefetch into this cache at once; each gets that part of the budget, so
        together they stay within it. Errors are not raised here; the read that needs the
        shard retries and raises them. Nothing is fetched ahead after a download from the store
        failed, until a read's download succeeds (see `downloader`).
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
        most = AHEAD_PER_THREAD * cache_options.prefetch_threads
        cache = self._shard_cache()
        ahead = 0
        with self._lock:
            for number, shard in enumerate(urls):
                if number > most:
                    return
                # the shard being read is not ahead, and the next one is always fetched (a
                # small budget, many processes to a node, would else fetch nothing)
                if number > 0:
                    ahead += sum(self.objects[url][1].size for url in self._files_of(shard))
                    if number > 1 and ahead > budget:
                        return
                self._fetch_ahead(shard, cache)

    def check_window(self, shards: list[str], *, share: int = 1) -> None:
        """See `Dataset.check_window`. The warning names what no window of as many shards
        passes (the dataset's largest shards together), not this window's own size: the text
        is then the same in every process and pass, so a DataLoader's workers, started again
        each epoch, each meeting a window of another size, give one warning that Python shows
        once, not one for every window size they meet."""
        if self._window_warned:
            return
        files = {url for shard in shards for url in self._files_of(shard)}
        max_bytes = self.options.cache.max_bytes
        room = max_bytes // max(1, share)
        if sum(self.objects[url][1].size for url in files) > room:
            self._window_warned = True
            count = len(set(shards))
            part = f"its part ({room} bytes) of " if share > 1 else ""
            shared = f", shared by {share} remote datasets" if share > 1 else ""
            warn(
                f"dataset {self.dataset!r}: the {count} shards of a shuffle window (up to "
                f"{self._largest(count)} bytes, read at once) do not fit in {part}the shard "
                f"cache (max_bytes {max_bytes}{shared}), so they are downloaded again and "
                f"again as their rows are read; raise `max_bytes` or lower "
                f"`shuffle_window_shards`",
            )

    def _largest(self, count: int) -> int:
        """The bytes of the dataset's `count` largest shards (with their `.npy` offsets)."""
        partners = {url for shard in self.objects for url in self._files_of(shard)[1:]}
        sizes = sorted(
            sum(self.objects[url][1].size for url in self._files_of(shard))
            for shard in self.objects
            if shard not in partners
        )
        return sum(sizes[-count:])

    def _shared_budget(self, budget: int, processes: int) -> int:
        """The part of half the cache each of the node's `processes` may prefetch, where
        `budget` each would pass it (warned of once per dataset and process): more evicts
        prefetched shards before they are read, which are then downloaded again."""
        shared = self.options.cache.max_bytes // 2 // processes
        if not self._budget_warned:
            self._budget_warned = True
            warn(
                f"dataset {self.dataset!r}: cache `prefetch_bytes` {budget} per process, for "
                f"{processes} processes on this node, passes half of `max_bytes` "
                f"({self.options.cache.max_bytes}); each prefetches {shared} bytes ahead",
            )
        return shared

    def mark_used(self, shard: str) -> None:
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

    def _prefetch_one(self, url: str, fs_path: str, item: CachedObject) -> None:
        # Errors are not raised here: the read that needs the object downloads it and raises
        # them, or this one where it waited on this download (see `downloader`).
        try:
            if self._store_failed.is_set():  # queued before a download failed
                return
            download = self.downloader(fs_path, item, foreground=False)
            self._shard_cache().ensure(item, download, pin=False)
        except Exception:  # raised again by the read that needs the object
            pass
        finally:
            with self._lock:
                self._queued.discard(url)

    def downloader(self, fs_path: str, item: CachedObject, *, foreground: bool = True) -> Any:
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
            given = self.index_data if item.url == self.index else None
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
