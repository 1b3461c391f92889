"""The shard cache's folder: where its files, temporary files, reservations and locks lie, and
the space bookkeeping each process sharing the folder does under its lock (`CacheFolder`).

Cached files are named by a digest and the end of their URL's basename (`cached_name`); other
files in the folder (a user's) are neither counted nor evicted. A download or make writes its
temporary file under `.downloading` and records its size in a marker under `.reserved`, both
only while it holds its name's lock (a file under `.name_locks`): what lies there without the
lock is a dead process's, swept by the next reservation. Eviction deletes the least recently
used files (by mtime, which every use marks) that no process holds a shared lock on.

The bytes of cached files are kept in a ledger (`.ledger`, under the folder lock), so that a
reservation that fits lists none of them: with 10,000 files, one listing took 40 ms, which
capped every process of a node together at 25 new shards a second. The ledger may count too
much (a file a cleaner deleted, a download that died), never too little: a placement adds its
size before its reservation's marker goes, a dead process's reservation adds its size before it
is swept, placed or not (a version before the ledger adds nothing: see docs/design.md). A
reservation that does not fit by the ledger, every `_RESCAN_EVERY`-th one, and one with no
ledger (the folder new, or made again) list the folder and set the ledger to what they found.
With more than `_FEW_FILES` files, an eviction frees a margin of `1/_MARGIN` of `max_bytes` past
what the reservation needs, so a full cache lists its folder once per that many bytes placed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Iterator

from zephon_torch._caller import warn
from zephon_torch.errors import ConfigError
from zephon_torch.io._cache_ledger import add_to_ledger, read_ledger, write_ledger
from zephon_torch.io._cache_names import CACHED_NAME
from zephon_torch.io._locks import close_tracked, flock, lock_file, open_tracked, release_file

# New names for the lock-based bookkeeping: versions that named the owner's pid kept theirs in
# .tmp, .reserve and .locks; sharing those with them would break both (see `CacheFolder.sweep`).
_TMP = ".downloading"
_RESERVE = ".reserved"
_LOCKS = ".name_locks"
_MAKE_TRIES = 3  # makes of a folder a cleaner deletes as it is made
_FOLDER_LOCK = ".lock"
_RESCAN_EVERY = 1024  # reservations between listings, for writers that keep no ledger
_FEW_FILES = 64  # a listing of more files than this frees a margin when it evicts
_MARGIN = 32  # that margin: 1/32 of max_bytes
# Waiting for a name's lock: polled, from the first interval doubling to the last, and warned
# of each STALL_S seconds the holder writes nothing (a live holder writes, or waits for room in
# a cache full of shards in use, up to `ShardCache`'s full_timeout: the warning names both)
_FIRST_POLL_S, _LAST_POLL_S = 0.002, 0.05
STALL_S = 60.0


class CacheFolderError(ConfigError):
    """The cache folder cannot be made (a file lies in the way, no access)."""


class CacheFolder:
    """One cache folder's layout and bookkeeping (see the module docstring).

    Args:
        directory: the folder, an absolute path.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def make(self) -> None:
        """Creates the folder and its bookkeeping folders where missing: at start, and before
        each download or make, as a cleaner (or a user) may delete the folder during a run.

        A folder deleted again while it is made (a cleaner's `rm -rf` under way) is made
        once more, up to three times in all.

        Raises:
            CacheFolderError: (a ConfigError) when the folder cannot be made.
        """
        for _ in range(_MAKE_TRIES):
            try:
                self._make_once()
                return
            except FileNotFoundError as error:  # deleted as it was made: make it again
                failure: OSError = error
            except OSError as error:
                failure = error
                break
        raise CacheFolderError(
            f"cannot use the shard cache folder {self.directory!r} "
            f"(io_options cache `dir`): {failure}"
        ) from None

    def _make_once(self) -> None:
        for sub in (_TMP, _RESERVE, _LOCKS):
            os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
        # there already, and not writable: the folder itself too, where downloads land
        for sub in ("", _TMP, _RESERVE, _LOCKS):
            folder = os.path.join(self.directory, sub)
            if not os.access(folder, os.W_OK):
                if not os.path.isdir(folder):
                    raise FileNotFoundError(f"{folder!r} was deleted as it was made")
                raise PermissionError(f"{folder!r} cannot be written")

    def intact(self) -> bool:
        """Whether the bookkeeping folders are there (a cleaner may delete the folder)."""
        return os.path.isdir(os.path.join(self.directory, _TMP))

    def reserve(self, name: str, size: int, made: str, max_bytes: int) -> str | None:
        """Under `name`'s lock: evicts LRU unpinned shards until `size` more bytes fit in
        `max_bytes`, then records a reservation for the file `name` and returns its marker
        file (see `release`); None when shards in use hold the space. `made`: the caller's own
        temporary file for `name`, already written (any other is a dead holder's)."""
        with self._folder_locked():
            if not self._evict_for(size, (name, made), max_bytes):
                return None
            marker = os.path.join(
                self.directory, _RESERVE, f"{size}-{uuid.uuid4().hex[:12]}-{name}"
            )
            with open(marker, "w"):
                pass
            return marker

    def release(self, marker: str, *, placed: bool) -> None:
        """Drops a reservation `reserve` recorded; `placed`: the file it was for is (or may
        be) in the folder now, and its size goes into the ledger. The folder (and its lock
        file) may be gone, with nothing left to undo then."""
        with contextlib.suppress(OSError), self._folder_locked():
            if placed:  # before the marker goes: a crash in between counts it twice, not never
                add_to_ledger(self.directory, _marker_size(marker))
            os.unlink(marker)

    def evict_to_free(self, size: int, name: str = "") -> bool:
        """Evicts LRU unpinned shards until `size` bytes are free on the disk for the file
        `name`, with what the other downloads under way have still to write: they take the
        room freed for one file alone (downloads racing on a full disk each freed room for
        their own, which the others filled, and failed with shards left to evict). False
        when that room could not be made."""
        with self._folder_locked():
            need = size + self._unwritten(name)
            entries = self.entries()
            total = sum(entry_size for _, entry_size, _ in entries)
            for path, entry_size, _ in sorted(entries, key=lambda entry: entry[2]):
                if self.free_bytes() >= need:
                    break
                if self._evict(path):
                    total -= entry_size
            write_ledger(self.directory, total, 0)
            return self.free_bytes() >= need

    def free_bytes(self) -> int:
        """The bytes free to this process on the folder's disk."""
        found = os.statvfs(self.directory)
        return found.f_bavail * found.f_frsize

    @property
    def _lock(self) -> str:
        return os.path.join(self.directory, _FOLDER_LOCK)

    def _folder_locked(self) -> contextlib.AbstractContextManager[None]:
        """The folder's lock, held over its bookkeeping (moments), with a warning where the
        wait for it lasts `STALL_S`."""
        said = (
            f"waiting {STALL_S:.0f} s for the lock of the shard cache {self.directory!r}: "
            "another process holds it, and holds it for moments only when it runs. It may be "
            "stopped (SIGSTOP, `docker pause`) or stuck in I/O; the wait goes on while it is"
        )
        return flock(self._lock, fcntl.LOCK_EX, slow=lambda: warn(said), after=STALL_S)

    def name_lock(self, name: str) -> str:
        return os.path.join(self.directory, _LOCKS, f"{name}.lock")

    @contextlib.contextmanager
    def name_locked(self, name: str) -> Iterator[None]:
        """Holds `name`'s lock: only its holder downloads or makes the file `name`, and its
        temporary file and reservation exist only while it holds the lock (see `sweep`)."""
        path = self.name_lock(name)
        fd = lock_file(path, wait=False)
        if fd is None:
            fd = self._wait_for_lock(name, path)
        try:
            yield
        finally:
            release_file(path, fd)

    def _wait_for_lock(self, name: str, path: str) -> int:
        """Waits for `name`'s lock, held by another process or thread that is downloading or
        making the file, and returns it. A warning says so each `STALL_S` seconds the
        holder's temporary file does not grow: a holder stopped (SIGSTOP, `docker pause`)
        holds the lock for as long as it is stopped, and the wait would be silent."""
        delay, seen, still_since = _FIRST_POLL_S, self._partial(name), time.monotonic()
        warned = still_since
        while True:
            time.sleep(delay)
            delay = min(2 * delay, _LAST_POLL_S)
            fd = lock_file(path, wait=False)
            if fd is not None:
                return fd
            now, partial = time.monotonic(), self._partial(name)
            if partial != seen:
                seen, still_since = partial, now
            elif now - still_since >= STALL_S and now - warned >= STALL_S:
                warned = now
                warn(
                    f"waiting {now - still_since:.0f} s for the cached copy {name!r} in the shard "
                    f"cache {self.directory!r}: another process holds its download and has "
                    "written nothing in that time. It may be stopped (SIGSTOP, `docker pause`) "
                    "or waiting for room in the cache; the wait goes on while it holds the file",
                )

    def _partial(self, name: str) -> list[tuple[str, int, int]]:
        """The temporary files being written for `name`: (name, size, modification time)."""
        found = []
        with (
            contextlib.suppress(FileNotFoundError),
            os.scandir(os.path.join(self.directory, _TMP)) as listing,
        ):
            for entry in listing:
                if entry.name.startswith(f"{name}."):
                    with contextlib.suppress(FileNotFoundError):
                        stat = entry.stat(follow_symlinks=False)
                        found.append((entry.name, stat.st_size, stat.st_mtime_ns))
        return sorted(found)

    def temp(self, name: str) -> str:
        """A fresh temporary path for the file `name` (written under `name`'s lock)."""
        return os.path.join(self.directory, _TMP, f"{name}.{uuid.uuid4().hex[:12]}")

    def _evict_for(self, size: int, mine: tuple[str, str], max_bytes: int) -> bool:
        """Under the folder lock and the lock of `mine` (a name and its caller's temporary
        file, see `reserve`): evicts LRU unpinned shards until `size` more bytes fit in
        `max_bytes`. The folder is listed only when the ledger says they do not fit, or is
        missing or due (see the module docstring)."""
        reserved = self.reserved_bytes(mine)
        ledger = read_ledger(self.directory)
        if ledger is not None:
            total, since = ledger[0], ledger[1] + 1
            if since < _RESCAN_EVERY and total + reserved + size <= max_bytes:
                write_ledger(self.directory, total, since)
                return True
        entries = sorted(self.entries(), key=lambda entry: entry[2])
        total = sum(entry_size for _, entry_size, _ in entries)
        many = len(entries) > _FEW_FILES and total + reserved + size > max_bytes  # evicts
        goal = max_bytes - (max_bytes // _MARGIN if many else 0)
        for path, entry_size, _ in entries:
            if total + reserved + size <= goal:
                break
            if self._evict(path):
                total -= entry_size
        write_ledger(self.directory, total, 0)
        return total + reserved + size <= max_bytes

    def _evict(self, path: str) -> bool:
        """Under the folder lock: deletes the cached file `path` unless it is pinned or its
        name's lock is held (by a process placing, replacing or dropping the file under that
        name, which is left to it: a file placed between the check and the unlink would be
        deleted pinned); True when it is gone."""
        lock = self.name_lock(os.path.basename(path))
        fd = lock_file(lock, wait=False)
        if fd is None:
            return False
        try:
            return delete_unpinned(path)
        finally:
            release_file(lock, fd)

    def entries(self) -> list[tuple[str, int, float]]:
        """The cached files: (path, size, last use). Other files in the folder (a user's,
        pointing `dir` at a folder in use) are neither counted nor evicted."""
        found = []
        with os.scandir(self.directory) as listing:
            for entry in listing:
                if not CACHED_NAME.match(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                found.append((entry.path, stat.st_size, stat.st_mtime))
        return found

    def reserved_bytes(self, mine: tuple[str, str]) -> int:
        """Under the folder lock: the bytes reserved by downloads and makes under way, once
        the leftovers of dead processes are swept (see `sweep`)."""
        return sum(_marker_size(m) for found in self._reservations(mine).values() for m in found)

    def _unwritten(self, own: str) -> int:
        """Under the folder lock, held by the caller of `own` (whose temporary file is gone):
        the bytes the downloads under way for other names have reserved and not written."""
        unwritten = 0
        for name, found in self._reservations(("", "")).items():  # `own`'s lock is held
            if name != own:
                written = sum(size for _, size, _ in self._partial(name))
                unwritten += max(0, sum(map(_marker_size, found)) - written)
        return unwritten

    def _reservations(self, mine: tuple[str, str]) -> dict[str, list[str]]:
        """Under the folder lock: the reservations' markers by the name of the file they are
        for, once the leftovers of dead processes are swept (see `sweep`)."""
        markers: dict[str, list[str]] = {}
        for marker in os.listdir(os.path.join(self.directory, _RESERVE)):
            markers.setdefault(marker.split("-", 2)[-1], []).append(marker)
        temps: dict[str, list[str]] = {}
        for temp in os.listdir(os.path.join(self.directory, _TMP)):
            temps.setdefault(temp.rsplit(".", 1)[0], []).append(temp)
        self.sweep(markers, temps, mine)
        return markers

    def sweep(
        self, markers: dict[str, list[str]], temps: dict[str, list[str]], mine: tuple[str, str]
    ) -> None:
        """Deletes the reservations and temporary files (grouped by the name of the file they
        are for) whose name's lock no one holds: their process died while downloading or
        making that file. Swept names leave `markers`, their sizes into the ledger first.

        Liveness is the lock, not a process id: containers sharing the cache folder on one
        kernel, each with its own process ids, sweep only what the dead left. The caller holds
        the lock of `mine`'s name, so what lies there (but its own temporary file) is a dead
        holder's: a job killed mid-download that restarts on the same shard."""
        own, made = mine

        def delete(name: str) -> None:  # under the name's lock
            dead = markers.pop(name, [])
            if dead:
                add_to_ledger(self.directory, sum(_marker_size(m) for m in dead))
            leftovers = [(_RESERVE, m) for m in dead]
            leftovers += [(_TMP, t) for t in temps.get(name, []) if t != made]
            for folder, leftover in leftovers:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, folder, leftover))

        for name in set(markers) | set(temps):
            if name == own:
                delete(name)
                continue
            path = self.name_lock(name)
            fd = lock_file(path, wait=False)
            if fd is None:  # held: a download or make under way
                continue
            try:
                delete(name)
            finally:
                release_file(path, fd)
        # Lock files alone: a process killed holding a name's lock before it reserved (waiting
        # for space) leaves only that. Free ones are deleted; a locker that opened one just
        # before finds it deleted and locks the current file (see `lock_file`).
        for lock in os.listdir(os.path.join(self.directory, _LOCKS)):
            name = lock.removesuffix(".lock")
            if name == own or name in markers or name in temps:
                continue
            path = self.name_lock(name)
            fd = lock_file(path, wait=False)
            if fd is not None:
                release_file(path, fd)


def _marker_size(marker: str) -> int:
    """The bytes a reservation's marker (a path or a name) records."""
    size = os.path.basename(marker).split("-", 1)[0]
    return int(size) if size.isdigit() else 0


def mark_used(path: str) -> bool:
    """Marks the file `path` as just used on the LRU clock (its mtime, shared by every
    process); False when it is not there."""
    try:
        os.utime(path)
    except OSError:
        return False
    return True


def delete_unpinned(path: str) -> bool:
    """Deletes `path` unless some process holds a lock on it (is reading it). Callers hold
    its name's lock, so no file is placed there meanwhile; should the name hold another file
    than the one locked all the same, it is left, and False returned. Its descriptor is
    tracked: a child forked meanwhile would else keep the lock (a reader that had opened the
    file waiting as long) and the deleted file, for its life."""
    try:
        fd = open_tracked(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        close_tracked(fd)
        return False
    try:
        if os.stat(path).st_ino != os.fstat(fd).st_ino:
            return False  # the file locked is gone; the name holds another
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        close_tracked(fd)
    return True
