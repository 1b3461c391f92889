"""Shard files mapped into memory, and the check that keeps a file cut short under its map from
killing the process.

A map reads the page cache in place (no copy, one copy per node). But if the file is truncated
in place while it is mapped, touching a page past its new end raises SIGBUS, which ends the
process without a message (a DataLoader worker "killed by signal"). So each read first checks,
with one fstat of the mapped file (about 1 us, per read call, not per row), that the file is
still as long as its map. A file replaced by a rename keeps its old pages and passes.
"""

from __future__ import annotations

import mmap
from typing import Any

from zephon_torch.errors import DataError
from zephon_torch.io._rows import CHANGED_NOTE


def map_file(path: str) -> mmap.mmap | bytes:
    """`path` mapped read-only (empty bytes for an empty file, which mmap refuses)."""
    with open(path, "rb") as handle:
        if not handle.seek(0, 2):
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def check_whole(data: Any, *, dataset: str, shard: str) -> None:
    """Raise DataError when the file mapped under `data` (a map, a memoryview of one, or a
    numpy array viewing one) is now shorter than its map; bytes and other buffers pass.

    Raises:
        DataError: naming the shard, with the sizes.
    """
    mapped = data
    while mapped is not None and not isinstance(mapped, mmap.mmap):
        mapped = mapped.obj if isinstance(mapped, memoryview) else getattr(mapped, "base", None)
    if mapped is None or mapped.closed:
        return
    size = mapped.size()
    if size < len(mapped):
        raise DataError(
            f"the shard file was cut to {size} bytes while {len(mapped)} were mapped; reading "
            f"on would crash the process{CHANGED_NOTE}",
            dataset=dataset,
            shard=shard,
        )
