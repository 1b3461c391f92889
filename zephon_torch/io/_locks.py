"""File locks for the shard cache, shared by processes and threads: `flock` on lock files.

A name's lock file is deleted by the holder that lets it go (`lock_file`/`release_file`), so
lock files do not pile up; the folder's lock (`flock`) stays. Every descriptor this process
flocks (these lock files, and the cache's pins on its files, see `_pins`) is tracked from its
`open` (`open_tracked`), so a forked child closes its copies (a flock belongs to the open
file, which a fork shares).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import threading
from collections.abc import Callable, Iterator

_HELD: set[int] = set()  # descriptors to flock this process opened and has not closed
_OPENING = threading.Lock()  # held while a descriptor enters or leaves _HELD, and over a fork


def open_tracked(path: str, flags: int) -> int:
    """`os.open(path, flags)`, tracked in `_HELD` from the start: a thread may be between
    the open and its flock, or waiting for it, when the process forks (see
    `_drop_inherited_locks`). Close it with `close_tracked`."""
    with _OPENING:
        fd = os.open(path, flags, 0o644)
        _HELD.add(fd)
    return fd


def close_tracked(fd: int) -> None:
    with _OPENING:
        _HELD.discard(fd)
        os.close(fd)


def _open_lock(path: str) -> int:
    """Opens (creates) the lock file `path`."""
    return open_tracked(path, os.O_RDWR | os.O_CREAT)


def lock_file(path: str, *, wait: bool) -> int | None:
    """An exclusive lock on the lock file `path` (created when missing): its descriptor, or
    None when `wait` is False and it is held.

    Holders delete the file as they let it go (`release_file`), so lock files do not pile
    up: a lock taken on a file already deleted (or replaced) guards nothing, and is taken
    again on the file now at `path`."""
    while True:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            close_tracked(fd)
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            return fd
        close_tracked(fd)


def release_file(path: str, fd: int) -> None:
    """Deletes the lock file `path` while still holding it (see `lock_file`), then lets go."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        close_tracked(fd)


@contextlib.contextmanager
def flock(
    path: str, mode: int, *, slow: Callable[[], None] | None = None, after: float = 60.0
) -> Iterator[None]:
    """Holds a flock of `mode` on the lock file `path`. `slow`: called (on a timer's thread)
    where the wait for it lasts `after` seconds: a holder stopped (SIGSTOP, `docker pause`)
    or stuck in I/O holds it for as long, and the wait would be silent."""
    fd = _open_lock(path)
    try:
        _take(fd, mode, slow, after)
        yield
    finally:
        close_tracked(fd)


def _take(fd: int, mode: int, slow: Callable[[], None] | None, after: float) -> None:
    if slow is None:
        fcntl.flock(fd, mode)
        return
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return
    except BlockingIOError:  # held: the wait is watched
        pass
    timer = threading.Timer(after, slow)
    timer.daemon = True
    timer.start()
    try:
        fcntl.flock(fd, mode)
    finally:
        timer.cancel()


def _drop_inherited_locks() -> None:
    """In a forked child: close its copies of the descriptors the parent's threads flock.

    A flock belongs to the open file, which a fork shares: a child keeping the copy would keep
    the lock after the parent's thread released it (or, for a thread still waiting, once it
    got it), and wait forever on it itself (a DataLoader worker forked while a thread was
    decompressing or evicting), or keep a shard pinned for its life. The parent's threads
    release their own copies as before."""
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    _OPENING.release()  # taken by the forking thread before the fork


os.register_at_fork(
    before=_OPENING.acquire,
    after_in_parent=_OPENING.release,
    after_in_child=_drop_inherited_locks,
)


def remove_unlocked(pattern: str) -> None:
    """Removes the files matching the glob ``pattern`` whose lock no process holds: a file
    its writer keeps locked for as long as it is in use, left by a writer that was killed (the
    lock went with the process). Liveness is the lock, not a process id: containers sharing a
    folder each have their own process ids."""
    for path in glob.glob(pattern):
        remove_if_unlocked(path)


def remove_if_unlocked(path: str) -> None:
    """Removes the file `path` unless a process holds its lock (see `remove_unlocked`). The
    descriptor it locks is tracked: a child forked meanwhile would else keep the lock for its
    life, and the writer that had just made the file wait as long for its own."""
    try:
        fd = open_tracked(path, os.O_RDONLY)
    except OSError:  # removed or renamed meanwhile, or another user's
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:  # held (BlockingIOError): in use; or removed meanwhile
        pass
    finally:
        close_tracked(fd)
