"""Plain JSONL shards read in place with `os.pread`, from a descriptor kept open.

Rows that lie close together (as rows read in order do) come from one read, others from one read
each. Unlike a slice of a memory map, a read survives the file being cut short under it: the
lines it no longer holds come back as None, for the reader to raise a `DataError`. A file's size,
inode and mtime tell whether it is still the one first indexed.
"""

from __future__ import annotations

import os


def identity(stat: os.stat_result) -> tuple[int, int, int]:
    """A plain shard file's size, inode and mtime: what a rewrite, an append or a replacement
    changes (not its ctime, which a `chmod` of the dataset's folder would move too)."""
    return stat.st_size, stat.st_ino, stat.st_mtime_ns


class Descriptor:
    """A shard opened for `os.pread`, closed when its last reference goes: the LRU drops
    handles, never closes them (another thread may be reading), and a file object dropped
    open would warn (ResourceWarning) in a user's test suite."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def fileno(self) -> int:
        return self.fd

    def __del__(self) -> None:
        if hasattr(self, "fd"):  # not when the open failed
            os.close(self.fd)


_NEAR = 2  # rows read at once while their span is at most this many times their bytes


def read_spans(fd: int, starts: list[int], ends: list[int]) -> list[bytes | None]:
    """The bytes of ``fd`` at each span ``(starts[i], ends[i])``, in order, None where the file
    now ends inside it: one `os.pread` for spans that lie close together (as rows read in order
    do), else one each."""
    if not starts:
        return []
    low, high = min(starts), max(ends)
    spans = list(zip(starts, ends, strict=True))
    if high - low <= _NEAR * (sum(ends) - sum(starts)):
        block = os.pread(fd, high - low, low)
        return [block[a - low : b - low] if b - low <= len(block) else None for a, b in spans]
    lines = [os.pread(fd, b - a, a) for a, b in spans]
    return [line if len(line) == b - a else None for line, (a, b) in zip(lines, spans)]
