"""This process's pins on shard-cache files: a shared `flock` on each file in use, which no
evicter's exclusive lock can take, counted per name so that one descriptor serves every reader
of a file in the process. Pin descriptors are opened by `_locks.open_tracked`, so a forked
child closes its copies of them, even one opened a moment before the fork and not yet
counted here."""

from __future__ import annotations

import fcntl
import os
import threading

from zephon_torch.io._locks import close_tracked, open_tracked


class Pins:
    """Pins on the files of one cache folder; thread-safe.

    Args:
        directory: the cache folder.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self.held: dict[str, tuple[int, int]] = {}  # name -> (fd holding LOCK_SH, count)
        # pins a forked child inherited from the thread that forked it: unpins still owed to
        # them (the parent's other threads do not run in the child, and never unpin)
        self.owed: dict[str, int] = {}
        self._by_thread: dict[int, dict[str, int]] = {}  # thread ident -> name -> its pins

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent thread may have held this one at the
        fork), and no pins held: the child's copies of the parent's pin descriptors were
        closed at the fork (`_locks`; the parent's threads unpin their own copies, and a child
        keeping them, a DataLoader worker, would keep those shards from eviction for its whole
        life), and the forking thread's pins are owed their unpins."""
        self._lock = threading.Lock()
        self.held = {}
        forking = threading.get_ident()
        for name, count in self._by_thread.get(forking, {}).items():
            self.owed[name] = self.owed.get(name, 0) + count
        self._by_thread = {}

    def _count(self, name: str, step: int) -> None:
        """Under the lock: this thread's pins on `name` change by `step`."""
        mine = self._by_thread.setdefault(threading.get_ident(), {})
        count = mine.get(name, 0) + step
        if count > 0:
            mine[name] = count
        else:
            mine.pop(name, None)
            if not mine:
                del self._by_thread[threading.get_ident()]

    def pin_existing(self, name: str) -> bool:
        """Pins the cached file `name` if it exists; False when it does not.

        A name this process holds already is checked too: someone else (a tmp cleaner) may
        have deleted the file while our pin held it, which no evicter does. Readers open the
        file by its name, so a pin on the deleted one would send them to a missing file.
        """
        with self._lock:
            held = self.held.get(name)
            if held is not None and self._at_name(name, held[0]):
                self.held[name] = (held[0], held[1] + 1)
                self._count(name, 1)
                return True
            path = os.path.join(self.directory, name)
            try:
                fd = open_tracked(path, os.O_RDONLY)
            except FileNotFoundError:
                return False
            fcntl.flock(fd, fcntl.LOCK_SH)
            # An evicter may have unlinked it between our open and our lock.
            if not self._at_name(name, fd):
                close_tracked(fd)
                return False
            self._hold(name, fd)
            return True

    def _at_name(self, name: str, fd: int) -> bool:
        """Whether `fd` is the file the folder holds as `name` (not one deleted since)."""
        try:
            return os.stat(os.path.join(self.directory, name)).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def stale(self, name: str) -> bool:
        """Whether the file pinned as `name` is no longer the one at its name: deleted (or
        replaced) under the pin, so a reader opening the name may have missed it."""
        with self._lock:
            return not self._at_name(name, self.held[name][0])

    def _hold(self, name: str, fd: int) -> None:
        """Under the lock: one more pin on `name`, now held by `fd`. A descriptor held for a
        file deleted under our pins is closed: its readers keep their own handles, and the
        pins counted on it now keep the new file (it closes with the last of them)."""
        held = self.held.get(name)
        if held is None:
            self.held[name] = (fd, 1)
        else:
            if held[0] != fd:
                close_tracked(held[0])
            self.held[name] = (fd, held[1] + 1)
        self._count(name, 1)

    def size(self, name: str) -> int:
        """The size of the file pinned as `name` (pinned by this process)."""
        with self._lock:
            return os.fstat(self.held[name][0]).st_size

    def place(self, name: str, temp: str) -> None:
        """Moves the finished file `temp` into the folder as `name`, pinned before it becomes
        visible, so no evicter can take it in between."""
        fd = open_tracked(temp, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.replace(temp, os.path.join(self.directory, name))
        except BaseException:
            close_tracked(fd)
            raise
        self._add(name, fd)

    def _add(self, name: str, fd: int) -> None:
        """Counts a pin on `name` held by `fd` (closed when `name` is pinned already, for the
        file at the name)."""
        with self._lock:
            held = self.held.get(name)
            if held is not None and self._at_name(name, held[0]):
                close_tracked(fd)
                fd = held[0]
            self._hold(name, fd)

    def unpin(self, name: str) -> None:
        """Lets one pin on `name` go; the last one closes its descriptor."""
        with self._lock:
            owed = self.owed.get(name, 0)
            if owed:  # the forking thread's pin, closed at the fork
                if owed > 1:
                    self.owed[name] = owed - 1
                else:
                    del self.owed[name]
                return
            fd, count = self.held[name]
            self._count(name, -1)
            if count > 1:
                self.held[name] = (fd, count - 1)
            else:
                del self.held[name]
                close_tracked(fd)
