"""How a reader turns a shard path into a local file it can open or memory-map.

Local readers open paths as they are. A remote dataset gives its readers a `locate` that
downloads the object into the node-local shard cache and yields the cached file, pinned until
the block ends. A memory map taken inside the block stays valid after it (Linux keeps an
unlinked file's data for its mappings), so the cache may evict the file later. Readers keep the
path (a URL) as the shard's name, so errors name the URL, never the cache file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

Locate = Callable[[str], AbstractContextManager[str]]
"""Yields a local file holding the object at a path; FileNotFoundError when there is none."""


def local_file(path: str) -> AbstractContextManager[str]:
    """The `Locate` of local files: the path itself."""
    return contextlib.nullcontext(path)
