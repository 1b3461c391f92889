"""The node-local shard cache: remote shards downloaded whole, then read by the local readers,
and files made from shards (decompressed JSONL, `open_made`).

A shard is downloaded once per node into `dir`, under a name derived from its URL, size and
version (etag or mtime), so a changed remote object gets a new file and the stale one ages out.
Downloads go to a temporary file that is renamed into place (`os.replace`): no reader ever sees
a partial shard. Processes and ranks of one node share the folder safely through `flock` locks:
one lock per shard name, so a shard is fetched once however many ask, and one folder lock for
the space bookkeeping. A name's lock file exists only while it is held (its holder deletes it),
so lock files do not pile up. Before a download, space is reserved (a marker file naming the
size and the shard) and least recently used shards are evicted until files plus reservations
fit in `max_bytes` (files the cache did not name, a user's, are neither counted nor evicted);
a ledger of the files' bytes spares that count a listing of the folder while they fit.
A process that dies mid-download leaves its temporary file and reservation
behind without their name's lock; the next reservation sweeps such leftovers (liveness is the
lock, not a process id, so containers with their own process ids can share the folder).
A shard that a process is opening or reading holds a shared lock on its file, and eviction
skips any file it cannot lock exclusively, so a shard is never deleted under a read. A cached
file of another size than its name's (cut short on the node) is dropped and downloaded again.
Readers keep recently used shards open or memory-mapped between reads without a lock; Linux
keeps an evicted file's data alive for them, so they stay valid, but its disk space is freed only
when the reader lets the shard go. Remote readers therefore keep at most an eighth of
`max_bytes` worth of shards open (2 to 16), which bounds that excess per dataset and process.
The folder's layout, reservations, sweeping and eviction are `_cache_folder`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from zephon_torch.errors import ConfigError, StorageError, ZephonError
from zephon_torch.io._cache_folder import (
    CacheFolder,
    CacheFolderError,
    delete_unpinned,
    mark_used,
)
from zephon_torch.io._cache_names import cached_name
from zephon_torch.io._pins import Pins
from zephon_torch.io._retry import disk_full

_FULL_POLL_S = 0.05
_MAKE_WAIT_S = 5.0  # how long a made file (decompressed shard) waits for room
_DISK_FULL_TRIES = 8  # downloads of one object into a full disk, evicting before each again


class CacheFullError(OSError):
    """No room for a made file: the cache stayed full of shards in use."""


class CacheDiskFullError(ConfigError):
    """The cache folder's disk filled before the cache reached `max_bytes`, and evicting the
    shards not in use did not make room."""


@dataclass(frozen=True)
class CachedObject:
    """A remote object as the cache knows it.

    Args:
        url: the object's URL, named in errors.
        size: its size in bytes.
        version: what changes when the object does (an etag, a modification time).
    """

    url: str
    size: int
    version: str
    key: str = ""  # names it in the cache instead of `url` (see `name`)

    @property
    def name(self) -> str:
        """The file name in the cache: a digest of url (or `key`), size and version, then the
        basename. A hub file's key is its path without the commit, as its version (a blob id)
        already says what it holds: a commit that leaves it unchanged downloads nothing.

        The basename keeps the extension, which readers use to tell compression apart.
        """
        key = f"{self.key or self.url}\0{self.size}\0{self.version}"
        return cached_name(key, self.url)


class ShardCache:
    """A size-bounded, LRU-evicted, multi-process-safe folder of downloaded shards.

    Args:
        directory: the cache folder; created when missing; may be shared by processes.
        max_bytes: the most bytes of shards (and reserved downloads) held at once.
        full_timeout: how long, in seconds, a download waits for space held by shards in use
            before raising StorageError.
    """

    def __init__(self, directory: str, max_bytes: int, *, full_timeout: float = 120.0) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.max_bytes = max_bytes
        self.full_timeout = full_timeout
        self._folder = CacheFolder(self.directory)
        self._folder.make()
        self._pins = Pins(self.directory)
        _LIVE.add(self)
        # this process's use of the cache, for stats
        self.hits = 0
        self.misses = 0
        self.bytes_downloaded = 0

    def after_fork(self) -> None:
        """In a forked child: see `Pins.after_fork`. Runs at every fork (see `_LIVE`)."""
        self._pins.after_fork()

    def path(self, item: CachedObject) -> str:
        """The local path `item` has once cached."""
        return os.path.join(self.directory, item.name)

    def lost(self, item: CachedObject) -> bool:
        """Whether `item`'s cached file, pinned by this process, was deleted (or replaced)
        under the pin by someone else, a tmp cleaner: a read of it by name may have failed
        for that alone, and another `open` downloads it again."""
        return self._pins.stale(item.name)

    @contextlib.contextmanager
    def open(self, item: CachedObject, download: Callable[[str], None]) -> Iterator[str]:
        """Yields the local path of `item`, downloading it first when not cached.

        The file is pinned (never evicted, by any process) until the block ends.

        Args:
            item: the remote object.
            download: writes the whole object to the path it is given (a temporary file).

        Raises:
            ConfigError: when the object alone is larger than `max_bytes`.
            StorageError: from `download`, or when space stays held by shards in use.
        """
        path = self.ensure(item, download, pin=True)
        try:
            yield path
        finally:
            self._pins.unpin(item.name)

    def ensure(self, item: CachedObject, download: Callable[[str], None], *, pin: bool) -> str:
        """Makes sure `item` is cached and returns its path; pins it when `pin` (see `open`).
        A download that fails as the cache folder is deleted under it (a tmp cleaner) is made
        once more, in the folder made again: a `FileNotFoundError` (an object gone from the
        store comes as a `DataError`), or any error once the folder is missing. Another
        process sharing the folder may have made it again already.

        Raises:
            CacheFolderError: (a ConfigError) when the folder went under that second
                download too, naming it and the object.
        """
        if item.size > self.max_bytes:
            raise ConfigError(
                f"cache `max_bytes` is {self.max_bytes}, smaller than the shard {item.url!r} "
                f"({item.size} bytes): raise the limit"
            )
        try:
            return self._ensure(item, download, pin=pin)
        except (OSError, ZephonError) as error:
            if not self._lost_folder(error):
                raise
        try:
            return self._ensure(item, download, pin=pin)
        except (OSError, ZephonError) as error:
            if not self._lost_folder(error):
                raise
            raise CacheFolderError(
                f"the shard cache folder {self.directory!r} (io_options cache `dir`) was "
                f"deleted under the download of {item.url!r}, and again under the download "
                "made once more: point `dir` at a folder no cleaner deletes "
                f"({type(error).__name__}: {error})"
            ) from error

    def _lost_folder(self, error: Exception) -> bool:
        """Whether a download's `error` may be the cache folder's, deleted under it (one
        that cannot be made again says so itself)."""
        if isinstance(error, CacheFolderError):
            return False
        lost = isinstance(error, FileNotFoundError)
        return lost or not self._folder.intact()

    def _ensure(self, item: CachedObject, download: Callable[[str], None], *, pin: bool) -> str:
        if self._pin_whole(item, locked=False):
            self.hits += 1
            return self._finish(item, pin)
        self._folder.make()
        with self._folder.name_locked(item.name):
            if self._pin_whole(item, locked=True):
                self.hits += 1
                return self._finish(item, pin)
            reservation = self._reserve(item.name, item.size, item.url)
            placed = False
            try:
                temp = self._folder.temp(item.name)
                try:
                    self._download_with_room(item, download, temp)
                    got = os.path.getsize(temp)
                    if got != item.size:
                        raise StorageError(
                            f"downloaded {got} bytes, expected {item.size}", url=item.url
                        )
                    placed = True  # or may be: counted in the ledger either way
                    self._pins.place(item.name, temp)
                    self.misses += 1
                    self.bytes_downloaded += got
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(temp)
            finally:
                self._folder.release(reservation, placed=placed)
        return self._finish(item, pin)

    def _download_with_room(
        self, item: CachedObject, download: Callable[[str], None], temp: str
    ) -> None:
        """Under `item`'s name's lock: `download(temp)`. A disk that fills first (before
        `max_bytes`, 64 GiB by default, as many nodes' disks do) has unpinned shards evicted,
        least recently used first, until the object fits, and the download is made once more:
        again while each eviction makes the room (a download started meanwhile by another
        process may take it), up to `_DISK_FULL_TRIES` downloads in all.

        Raises:
            CacheDiskFullError: (a ConfigError) when the disk stays full: a download fails
                after an eviction that could not make the room, or as often as that.
        """
        room = True
        for attempt in range(1, _DISK_FULL_TRIES + 1):
            try:
                download(temp)
                return
            except OSError as error:
                if not disk_full(error):
                    raise
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
                if room and attempt < _DISK_FULL_TRIES:
                    room = self._folder.evict_to_free(item.size, item.name)
                    continue
                raise CacheDiskFullError(
                    f"the disk of the shard cache folder {self.directory!r} is full "
                    f"({self._folder.free_bytes()} bytes free, the cache's shards holding "
                    f"{self.used_bytes()}) before the cache reached its `max_bytes` "
                    f"({self.max_bytes}): {item.url!r} ({item.size} bytes) does not fit; lower "
                    "io_options cache `max_bytes` to what the disk can hold, or free space on it"
                ) from error

    def _pin_whole(self, item: CachedObject, *, locked: bool) -> bool:
        """Pins `item`'s cached file where it is there whole. A copy of another size than the
        one its name is for was cut short on this node (by a cleaner, a full disk, a crash):
        it would fail every read of every job on the node, so it is dropped, as `discard`
        drops a copy whose hash is wrong, and downloaded again. `locked`: the caller holds
        the name's lock, which dropping needs (else the caller asks again under it).

        Raises:
            StorageError: for such a copy that another process is reading, naming it.
        """
        if not self._pins.pin_existing(item.name):
            return False
        size = self._pins.size(item.name)
        if size == item.size:
            return True
        self._pins.unpin(item.name)
        if not locked or delete_unpinned(self.path(item)):
            return False
        raise StorageError(
            f"the cached copy {self.path(item)!r} is {size} bytes, not the {item.size} of the "
            "object it was downloaded from: it was cut short on this node's disk (the object "
            "is not at fault), and cannot be replaced while another process reads it",
            url=item.url,
        )

    @contextlib.contextmanager
    def open_made(self, key: str, url: str, make: Callable[[str], None]) -> Iterator[str]:
        """Yields the local path of a file that `make(path)` writes (a decompressed shard),
        pinned as in `open`: made once per node, then cached and evicted like a download.

        Its name comes from `key` alone (its size is known only once it is made), so the
        first process to need it makes it under that name's lock while the others wait, then
        find it. Made again when it was evicted. Space is reserved, and evicted for, once the
        file is made: while it is being made, its partial file is not yet counted against
        `max_bytes`.

        Args:
            key: names the file's content; must change when its source does.
            url: what errors name (the source, and how the file derives from it).
            make: writes the whole file to the path it is given.

        Raises:
            ConfigError: when the file alone is larger than `max_bytes`.
            CacheFullError: (an OSError) when space for it stays held by shards in use for a
                few seconds; the caller can hold the content elsewhere.
        """
        name = cached_name(key, url)
        if self._pins.pin_existing(name):
            self.hits += 1
        else:
            self._folder.make()
            with self._folder.name_locked(name):
                if self._pins.pin_existing(name):
                    self.hits += 1
                else:
                    self._make(name, url, make)
        path = os.path.join(self.directory, name)
        mark_used(path)
        try:
            yield path
        finally:
            self._pins.unpin(name)

    def _make(self, name: str, url: str, make: Callable[[str], None]) -> None:
        """Under `name`'s lock: makes the file, reserves its size, places it pinned."""
        temp = self._folder.temp(name)
        try:
            make(temp)
            size = os.path.getsize(temp)
            if size > self.max_bytes:
                raise ConfigError(
                    f"cache `max_bytes` is {self.max_bytes}, smaller than {url!r} "
                    f"({size} bytes): raise the limit"
                )
            # not the downloads' long wait: the caller may hold a pin on the source, and
            # callers that do may hold all the space between them while each waits
            reservation = self._reserve(
                name, size, url, made=os.path.basename(temp), wait=_MAKE_WAIT_S
            )
            try:
                self._pins.place(name, temp)
                self.misses += 1
            finally:  # placed, or may be: counted in the ledger either way
                self._folder.release(reservation, placed=True)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def touch(self, item: CachedObject) -> bool:
        """Marks `item`'s cached file as just used; False when it is not cached."""
        return mark_used(self.path(item))

    def discard(self, item: CachedObject) -> bool:
        """Deletes `item`'s cached file (a bad copy), unless a process has it pinned; True
        when it is gone."""
        with self._folder.name_locked(item.name):
            return delete_unpinned(self.path(item))

    def used_bytes(self) -> int:
        """Bytes held by cached shards (reservations not counted)."""
        return sum(size for _, size, _ in self._folder.entries())

    def _finish(self, item: CachedObject, pin: bool) -> str:
        path = self.path(item)
        mark_used(path)
        if not pin:
            self._pins.unpin(item.name)
        return path

    def _reserve(
        self, name: str, size: int, url: str, *, made: str = "", wait: float | None = None
    ) -> str:
        """Under `name`'s lock: evicts until `size` more bytes fit, then records a reservation
        for the file `name`; returns its marker file. `made`: the caller's own temporary file
        for `name`, already written (any other is a dead holder's). `wait`: how long to wait
        for space held by shards in use before `CacheFullError` (default: `full_timeout`,
        then `StorageError`)."""
        deadline = time.monotonic() + (self.full_timeout if wait is None else wait)
        while True:
            marker = self._folder.reserve(name, size, made, self.max_bytes)
            if marker is not None:
                return marker
            if time.monotonic() > deadline:
                if wait is not None:
                    raise CacheFullError(
                        f"the shard cache {self.directory!r} (max_bytes={self.max_bytes}) "
                        f"stayed full of shards in use for {wait:g} s"
                    )
                raise StorageError(
                    f"the shard cache {self.directory!r} (max_bytes={self.max_bytes}) stayed "
                    f"full of shards in use for {self.full_timeout:.0f} s; raise `max_bytes`",
                    url=url,
                )
            time.sleep(_FULL_POLL_S)


_LIVE: weakref.WeakSet[ShardCache] = weakref.WeakSet()


def _reset_in_child() -> None:
    for cache in list(_LIVE):
        cache.after_fork()


os.register_at_fork(after_in_child=_reset_in_child)
