"""Row counts of remote shards from as few bytes as can be.

A Parquet footer is read from the file's tail by one range read (two when the footer is longer
than the guess); JSONL and Vortex shards are downloaded whole to be counted. Either count is
remembered in the index cache folder, under the object's cache name (URL, size and version), so
a later open, by any run, process or node sharing the folder, reads nothing but the listing.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

from zephon_torch._atomic import write_text_atomically
from zephon_torch.errors import DataError
from zephon_torch.io._shard_cache import CachedObject

_ROW_COUNTS = "remote-rows"  # folder of remembered row counts, in the index cache folder
_FOOTER_GUESS = 64 << 10  # bytes read from a Parquet file's end to find its footer
_PARQUET_MIN_BYTES = 12  # the magic bytes at both ends and the footer length


def parquet_rows(tail: Callable[[int], bytes], *, size: int, url: str, dataset: str) -> int:
    """The row count in a Parquet footer.

    Args:
        tail: the last n bytes of the object (the caller retries the read).
        size: the object's size in bytes.
        url: the shard, named in errors.
        dataset: the dataset, named in errors.

    Raises:
        DataError: at once, for bytes that are not a Parquet footer.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    def bad(reason: object) -> DataError:
        return DataError(f"not a readable Parquet file: {reason}", dataset=dataset, shard=url)

    if size < _PARQUET_MIN_BYTES:
        raise bad(f"{size} bytes is too short")
    data = tail(_FOOTER_GUESS)
    if data[-4:] != b"PAR1":
        raise bad("the file does not end in the Parquet magic bytes")
    length = int.from_bytes(data[-8:-4], "little") + 8
    if length > len(data) and len(data) < size:
        data = tail(length)
    try:
        return int(pq.read_metadata(pa.BufferReader(data[-length:])).num_rows)
    except (pa.ArrowInvalid, OSError) as error:  # pyarrow raises OSError for bad thrift
        raise bad(error) from error


def remembered_rows(index_cache_dir: str, item: CachedObject) -> int | None:
    """The row count remembered for this version of the object, else None (always for an
    object listed without a version: a rewrite of the same size could not be told apart)."""
    if not item.version:
        return None
    with (
        contextlib.suppress(OSError, ValueError, KeyError, TypeError),
        open(_record(index_cache_dir, item), encoding="utf-8") as handle,
    ):
        return int(json.load(handle)["rows"])
    return None


def remember_rows(index_cache_dir: str, item: CachedObject, rows: int) -> None:
    """Remembers the object's row count; a folder that cannot be written is skipped, and so is
    an object listed without a version (ETag, time), which is counted again at every open."""
    if not item.version:
        return
    with contextlib.suppress(OSError):
        text = json.dumps({"url": item.url, "rows": rows})
        write_text_atomically(_record(index_cache_dir, item), text)


def _record(index_cache_dir: str, item: CachedObject) -> str:
    return os.path.join(index_cache_dir, _ROW_COUNTS, f"{item.name}.json")
