"""Line-offset indexes of JSONL bytes: one vectorised scan per file version, cached on disk.

An index is an int64 array of shape (2, n): row i is `buffer[index[0, i]:index[1, i]]`, the i-th
non-blank line without the "\\n" or "\\r\\n" that ends it. Blank lines (empty or ASCII whitespace
only, the first also after a byte-order mark) are not rows; a last line without a trailing
newline is. numpy finds the newlines in 64 MiB chunks, so scratch memory is a 64 MiB mask plus
a few int64 per line whatever the file size (0.4 GB/s with 60-byte lines, 1.3 GB/s with
500-byte ones, one core); only lines that start with whitespace are checked one by one.
Indexes are saved as .npy files keyed by (absolute path, size, mtime_ns) and written
atomically, so each version of a file is scanned once, by whichever process gets there first.
A writer locks its temporary file (under `.writing/`) until it is renamed into place, so the
temporary of a writer that was killed (its lock went with it) is removed by the next index
written in the folder.

A local file's indexes lie in a subfolder named by its path (`<path digest>/<version>.npy`), so
that writing one looks only at the versions of that file: in one shared folder, each index
written listed every index there, and the first open of 1,500 `.jsonl` files took 4.5 s. The
indexes of downloads are named by the download alone and lie in the folder itself; those unused
for a week go at the first index a process writes in the folder, then at most every
`_TIDY_S`, with the indexes and temporaries of earlier layouts (see `_tidy`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.io._locks import close_tracked, lock_file, remove_if_unlocked, remove_unlocked
from zephon_torch.io._mapped import map_array

LineIndex = npt.NDArray[np.int64]

_INDEX_VERSION = 3
_UNUSED_S = 7 * 24 * 3600  # an index of another version of its file unused this long goes
_WRITING = ".writing-"  # an index being written, locked by its writer (see `_sweep`)
_UNLOCKED = ".tmp-"  # temporaries of versions before the lock: no write takes _UNLOCKED_S
_UNLOCKED_S = 24 * 3600
_WRITING_DIR = ".writing"  # where temporaries are written (see `_sweep`)
_TIDY_S = 600.0  # a process tidies a folder (`_tidy`) at most this often
_TIDIED: dict[str, float] = {}  # folder to when this process last tidied it
_CLAIMING = threading.Lock()  # held over a claim of a tidy (two dict operations, see `_tidy`)
_NAMED = re.compile(r"[0-9a-f]{32}\.npy")  # a download's index (see `cache_file`)
_FLAT = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}\.npy")  # a local file's, before the subfolders
_CHUNK_BYTES = 1 << 26
_NEWLINE = 10
_CARRIAGE_RETURN = 13
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some editors start a file with
_MAY_BE_BLANK = _WHITESPACE.copy()
_MAY_BE_BLANK[_BOM[0]] = True

_log = logging.getLogger(__name__)


def scan_lines(buffer: Any) -> LineIndex:
    """Finds the non-blank lines of a byte buffer.

    Args:
        buffer: any object exporting the buffer protocol (bytes, mmap, memoryview).

    Returns:
        An int64 array of shape (2, n): each non-blank line's start offset, and its end offset
        before the "\\n" or "\\r\\n" that ends it.
    """
    data = np.frombuffer(buffer, dtype=np.uint8)
    size = int(data.size)
    chunks = [
        np.flatnonzero(data[offset : offset + _CHUNK_BYTES] == _NEWLINE) + offset
        for offset in range(0, size, _CHUNK_BYTES)
    ]
    newlines = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
    starts = np.concatenate((np.zeros(1, dtype=np.int64), newlines + 1))
    ends = np.concatenate((newlines, np.full(1, size, dtype=np.int64)))
    nonempty = ends > starts
    starts, ends = starts[nonempty], ends[nonempty]
    # CRLF files: leave the "\r" out of the row, so rows parse on the fast path.
    ends = ends - (data[ends - 1] == _CARRIAGE_RETURN)
    nonempty = ends > starts
    starts, ends = starts[nonempty], ends[nonempty]
    # A line that starts with whitespace, or a byte-order mark (an editor's empty first line;
    # one inside the file where `cat` joined such files), may be blank; those are rare, check
    # each.
    suspects = np.flatnonzero(_MAY_BE_BLANK[data[starts]])
    if suspects.size:
        blank = [i for i in suspects.tolist() if _blank(data, int(starts[i]), int(ends[i]))]
        if blank:
            keep = np.ones(starts.size, dtype=bool)
            keep[blank] = False
            starts, ends = starts[keep], ends[keep]
    return np.stack((starts, ends)).astype(np.int64, copy=False)


def _blank(data: npt.NDArray[np.uint8], start: int, end: int) -> bool:
    """Whether ``data[start:end]`` is whitespace alone, after a byte-order mark if any."""
    if bytes(data[start : start + 3]) == _BOM:
        start += 3
    return bool(_WHITESPACE[data[start:end]].all())


def default_cache_dir() -> str:
    """Returns `$ZEPHON_TORCH_CACHE/index`, or `~/.cache/zephon_torch/index` when unset."""
    root = os.environ.get("ZEPHON_TORCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "zephon_torch"
    )
    return os.path.join(root, "index")


def cache_file(cache_dir: str, path: str, name: str | None = None) -> str:
    """Returns where the index of the current version of `path` is cached.

    Args:
        cache_dir: the index cache folder.
        path: the indexed file; it is stat-ed, not read.
        name: a name that says which version of which file `path` holds (a download in the
            shard cache: its cache name), used instead of its path, size and mtime.

    Returns:
        A path inside `cache_dir` that changes whenever the file's size, mtime, inode or
        ctime (or `name`) changes: a file replaced by one of the same size and mtime (`cp -p`,
        `rsync -a`, a tar extraction) has another inode, or at least a new ctime, which no
        tool sets back. A local file's lies in a subfolder named by a digest of its path alone,
        so that a new version's index lets those of the old ones go (see `_save`); a
        download's (`name`) lies in `cache_dir` itself.
    """
    if name is None:
        stat = os.stat(path)
        where = _digest(f"{_INDEX_VERSION}\0{os.path.abspath(path)}")
        what = _digest(f"{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\0{stat.st_ctime_ns}")
        return os.path.join(cache_dir, where, f"{what}.npy")
    key = f"{_INDEX_VERSION}\0named\0{name}"
    return os.path.join(cache_dir, f"{_digest(key, 32)}.npy")


def _digest(text: str, digits: int = 16) -> str:
    """A digest of `text`; a path's undecodable bytes (surrogates, as os.listdir gives a
    name that is not UTF-8) are hashed as they are, not a bare UnicodeEncodeError."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


def load_or_build(
    path: str, cache_dir: str, read: Callable[[], Any], *, name: str | None = None
) -> LineIndex:
    """Loads the cached index of `path`, or scans `read()` and caches the result.

    Args:
        path: the JSONL file (compressed or not).
        cache_dir: the index cache folder; created when missing. When it cannot be written the
            index is still returned, only not cached.
        read: returns the file's (decompressed) bytes; called only when no valid index is cached.
        name: see `cache_file`.

    Returns:
        The index, memory-mapped when it came from the cache.
    """
    target = cache_file(cache_dir, path, name)
    cached = _load(target)
    if cached is not None:
        return cached
    index = scan_lines(read())
    _save(index, target)
    return index


def _load(target: str) -> LineIndex | None:
    if not os.path.exists(target):
        return None
    try:
        index = map_array(target)
    except (OSError, ValueError, EOFError):
        return None  # a torn or foreign file: rebuild it
    if index.ndim != 2 or index.shape[0] != 2 or index.dtype != np.int64:
        return None
    with contextlib.suppress(OSError):  # used now: kept from `_forget_older` (a read-only cache)
        os.utime(target)
    return index


_UNWRITABLE: set[str] = set()  # index folders already warned of, once per process each


def _cannot_cache(directory: str, error: OSError) -> None:
    """Log that the index cannot be cached in `directory`, once per folder: a dataset of
    thousands of shards said it once per shard."""
    if directory not in _UNWRITABLE:
        _UNWRITABLE.add(directory)
        _log.warning(
            "cannot cache the JSONL line index in %r: %s (said once; each shard is scanned "
            "at each open)",
            directory,
            error,
        )


def _save(index: LineIndex, target: str) -> None:
    directory, named = os.path.dirname(target), _named(target)
    root = directory if named else os.path.dirname(directory)
    writing = os.path.join(root, _WRITING_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        os.makedirs(writing, exist_ok=True)
        _sweep(writing)
        _tidy(root)
        handle, temporary = tempfile.mkstemp(dir=writing, prefix=_WRITING, suffix=".npy")
        os.close(handle)
        # held until the file has its final name; taken again on a new file where a sweep
        # removed this one before the lock (see `lock_file`)
        lock = lock_file(temporary, wait=True)
    except OSError as error:
        _cannot_cache(root, error)
        return
    assert lock is not None
    try:
        with open(temporary, "wb") as out:
            np.save(out, index, allow_pickle=False)
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if not isinstance(error, OSError):
            raise
        _cannot_cache(root, error)
        return
    finally:
        close_tracked(lock)
    if not named:
        _forget_older(target)


def _named(target: str) -> bool:
    """Whether `target` is a download's index (named by the download, in the folder itself)."""
    return _NAMED.fullmatch(os.path.basename(target)) is not None


def _sweep(writing: str) -> None:
    """Removes the temporary files in the folder `writing` whose writer died writing them
    (killed: up to the whole index, 16 bytes a row): those whose lock no one holds
    (`remove_unlocked`). Only writes under way and such leftovers lie there: a short list."""
    remove_unlocked(os.path.join(glob.escape(writing), f"{_WRITING}*.npy"))


def _tidy(root: str) -> None:
    """At most once per `_TIDY_S` per process: one listing of the index folder `root` that
    removes the indexes of downloads unused for `_UNUSED_S` (no name groups the versions of one
    object, so every download's index unused that long goes), those of the flat layout before
    the subfolders (never used again: they go once as old), the temporaries that layout's
    writers left there (unlocked), and the unlocked temporaries of earlier versions once a day
    old. Other files, a user's (`.npy` arrays too), stay: only those names are indexes'."""
    now = time.time()
    with _CLAIMING:  # one thread claims a due tidy (a fork waits for the claim)
        last = _TIDIED.get(root)
        if last is not None and now - last < _TIDY_S:
            return
        _TIDIED[root] = now
    with contextlib.suppress(OSError), os.scandir(root) as listing:
        for entry in listing:
            name = entry.name
            if not name.endswith(".npy"):  # a user's file: the folder may hold others
                continue
            if name.startswith(_WRITING):
                remove_if_unlocked(entry.path)
                continue
            if name.startswith(_UNLOCKED):
                limit = now - _UNLOCKED_S
            elif _NAMED.fullmatch(name) or _FLAT.fullmatch(name):
                limit = now - _UNUSED_S  # a download's, or one of the flat layout
            else:
                continue
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < limit:
                    os.unlink(entry.path)


# taken by the forking thread over a fork, so that no other thread holds it in the child
os.register_at_fork(
    before=_CLAIMING.acquire,
    after_in_parent=_CLAIMING.release,
    after_in_child=_CLAIMING.release,
)


def _forget_older(target: str) -> None:
    """Removes the cached indexes of other versions of the file `target` indexes (the other
    files of its subfolder) that no open has used for `_UNUSED_S`: a file rewritten again and
    again would leave one index per version for ever. Versions in use stay, such as the copies
    nodes keep of a dataset at one path (`rsync -a`: other inodes) with a shared cache folder;
    each load marks its index used. A process still reading a removed one keeps it mapped."""
    name = os.path.basename(target)
    unused = time.time() - _UNUSED_S
    with contextlib.suppress(OSError), os.scandir(os.path.dirname(target)) as listing:
        for entry in listing:
            if entry.name == name or not entry.name.endswith(".npy"):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < unused:
                    os.unlink(entry.path)
