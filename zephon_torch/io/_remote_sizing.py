"""How many remote shards are held at once, sized to fit the node-local shard cache.

A shard a local reader keeps open or mapped holds its disk space even once the cache evicts it,
and each thread of the open that counts a JSONL shard holds it whole (decompressed too) while
it counts: both are bounded so that what they hold fits in the cache's `max_bytes` (and on the
disk, where that is smaller). Pure functions of the listed sizes and the cache settings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from zephon_torch.io.formats import COMPRESSION_ENDINGS

if TYPE_CHECKING:
    from zephon_torch.io._io_options import CacheOptions
    from zephon_torch.io._shard_cache import CachedObject

_MAPPED_SHARE = 8  # shards kept open by a local reader take at most max_bytes / this
_MIN_OPEN, _MAX_OPEN = 2, 16
_INFLATION = 8  # a compressed JSONL shard's decompressed size, in its sizes, as the open guesses


def opening_threads(
    most: int,
    *,
    format_: str,
    objects: Mapping[str, tuple[str, CachedObject]],
    cache: CacheOptions,
) -> int:
    """How many shards the open counts at once: `most`, or fewer for JSONL, whose count
    downloads each shard whole and decompresses a compressed one into the cache (taken
    as `_INFLATION` times its size), so that what the counts hold at once fits in the
    cache: more threads, each holding a shard while it waits for room for the next,
    would go past `max_bytes` together and stall, then fall back to memory."""
    if format_ != "jsonl":
        return most
    need = max(
        (
            item.size * (1 + _INFLATION if url.endswith(COMPRESSION_ENDINGS) else 1)
            for url, (_, item) in objects.items()
        ),
        default=0,
    )
    return max(1, min(most, cache.max_bytes // max(need, 1)))


def max_open(objects: Mapping[str, tuple[str, CachedObject]], cache: CacheOptions) -> int:
    """How many shards the local reader keeps open or mapped between reads. The cache may
    evict such a shard, but its disk space is freed only when the reader lets it go, so
    they are sized to an eighth of `max_bytes`, or of the disk where that is smaller (the
    default 64 GiB on a small disk: 16 evicted shards held open filled it), between 2
    and 16 shards."""
    largest = max((item.size for _, item in objects.values()), default=0)
    room = min(cache.max_bytes, disk_size(cache.directory))
    fitting = room // _MAPPED_SHARE // max(largest, 1)
    return max(_MIN_OPEN, min(_MAX_OPEN, fitting))


def disk_size(folder: str) -> int:
    """The size of the disk `folder` (or its nearest existing parent) is on; unbounded where
    that cannot be told."""
    path = os.path.abspath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        found = os.statvfs(path)
    except OSError:
        return sys.maxsize
    return found.f_blocks * found.f_frsize
