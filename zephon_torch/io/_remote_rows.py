"""Row counts of remote shards from as few bytes as can be.

A Parquet footer is read from the file's tail by one range read (two when the footer is longer
than the guess); a `.npy` token file's rows come from its header, or its offsets file's header
and two values; JSONL and Vortex shards are downloaded whole to be counted. Either count, with
a Parquet shard's row-group sizes and columns, is remembered in the index cache folder, under
the object's cache name (URL, size and version), so a later open, by any run, process or node
sharing the folder, reads nothing but the listing. A footer is remembered only once the object
is found as listed after its reads (see `listed_parquet_layout`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from zephon_torch._atomic import write_text_atomically
from zephon_torch.errors import DataError
from zephon_torch.io._arrow import Columns, schema_columns
from zephon_torch.io._download import check_unchanged, read_listed
from zephon_torch.io._mapped import MAX_HEADER_BYTES, read_header
from zephon_torch.io._retry import RetryPolicy
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._stall import cat_range
from zephon_torch.io.npy import check_row_length, offsets_path, unused_offsets
from zephon_torch.io.parquet import ESTIMATE_VERSION, group_sizes

_ROW_COUNTS = "remote-rows"  # folder of remembered row counts, in the index cache folder
_FOOTER_GUESS = 64 << 10  # bytes read from a Parquet file's end to find its footer
# the most bytes a `.npy` header takes: magic, version, length, then its text
_HEADER_BYTES = 12 + MAX_HEADER_BYTES

Objects = Mapping[str, tuple[str, CachedObject]]  # URL -> (file-system path, listing entry)


Groups = tuple[tuple[int, int], ...]  # each row group's rows and decoded bytes
Layout = tuple[int, Groups, Columns]  # rows, row groups (Parquet), columns (Parquet, Vortex)
SCHEMA_FORMATS = ("parquet", "vortex")  # whose columns are remembered with the row count


def parquet_layout(tail: Callable[[int], bytes], *, size: int, url: str, dataset: str) -> Layout:
    """The row count, row-group sizes (see `parquet.group_sizes`) and columns in a Parquet
    footer.

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

    # What is not Parquet (too short, no magic bytes at its end) is left to pyarrow to refuse,
    # as it refuses the local file: the same words for a shard wherever it is.
    data = tail(_FOOTER_GUESS)  # the whole object where it is shorter (b"" for an empty one)
    if data[-4:] == b"PAR1":
        length = int.from_bytes(data[-8:-4], "little") + 8
        if length > len(data) and len(data) < size:
            data = tail(length)
        data = data[-length:]
    try:
        metadata = pq.read_metadata(pa.BufferReader(data))
        columns = schema_columns(metadata.schema.to_arrow_schema())
        return int(metadata.num_rows), group_sizes(metadata), columns
    # pyarrow raises OSError for bad thrift, and UnicodeDecodeError for a name not in UTF-8
    except (pa.ArrowInvalid, OSError, ValueError) as error:
        raise bad(error) from error


def listed_parquet_layout(
    path: str, objects: Objects, *, fs: Any, policy: RetryPolicy, dataset: str
) -> Layout:
    """The row count, row-group sizes and columns from the footer, by range reads
    (retried); no download. The reads are not tied to the listed version, so the object
    is then checked to be it still (one HEAD, as after a download): a rewrite between the
    listing and the reads would else be remembered as the listed version's layout, and
    read as such should the object come back to the listed bytes (an S3 ETag is their
    MD5), every pass losing the rows past the rewrite's count.

    Raises:
        DataError: the object changed or went since it was listed, or is not Parquet.
    """
    fs_path, item = objects[path]

    def tail(length: int) -> bytes:
        def attempt() -> bytes:
            start = max(0, item.size - length)
            return cat_range(fs, fs_path, start, item.size, policy, listed=item.size)

        what = "reading the footer"
        return read_listed(attempt, fs, fs_path, item, dataset=dataset, retry=policy, what=what)

    try:
        layout = parquet_layout(tail, size=item.size, url=path, dataset=dataset)
    except DataError:  # a footer cut from a rewrite's bytes: say that it changed
        check_unchanged(fs, fs_path, item, dataset=dataset, retry=policy)
        raise
    check_unchanged(fs, fs_path, item, dataset=dataset, retry=policy)
    return layout


def counted_columns(reader: Any, local: str) -> Layout:
    """A downloaded shard's row count and columns (a Vortex file's)."""
    return reader.num_rows(local), (), reader.columns(local)


def npy_rows(
    url: str,
    objects: Objects,
    *,
    fs: Any,
    policy: RetryPolicy,
    dataset: str,
    companions: frozenset[str] = frozenset(),
) -> int | None:
    """A 2-D token file's first dimension, or one less than its offsets file's length, read
    from headers (retried); an offsets file must also start at 0 and end at the token count
    (two values read by range). None for anything else: the caller's reader downloads the files
    and raises its DataError; that the offsets rise is checked when the shard is read.

    Raises:
        DataError: at once (not retried), naming the dataset and the shard `url`, for a token
            or offsets file shorter than its header says: the span of values a header gives is
            checked against the listed size before any value is read.
    """
    header = _npy_header(url, objects, fs=fs, policy=policy, dataset=dataset, shard=url)
    partner = offsets_path(url)
    if header is not None and len(header[0]) == 2:
        check_row_length(url, header[0], dataset=dataset)
        if partner in objects and partner not in companions:  # named: see `Listing`
            raise unused_offsets(url, header[0], dataset=dataset)
        return header[0][0]
    if header is not None and len(header[0]) == 1 and partner in objects:
        bounds = _npy_header(partner, objects, fs=fs, policy=policy, dataset=dataset, shard=url)
        if bounds is not None and len(bounds[0]) == 1 and bounds[0][0] >= 2:
            (count,), dtype, start = bounds
            last = start + (count - 1) * dtype.itemsize
            read = partial(
                _npy_value, partner, objects, dtype=dtype, fs=fs, policy=policy, dataset=dataset
            )
            if (read(start, shard=url), read(last, shard=url)) == (0, header[0][0]):
                return count - 1
    return None


def _npy_header(
    url: str, objects: Objects, *, fs: Any, policy: RetryPolicy, dataset: str, shard: str
) -> tuple[tuple[int, ...], np.dtype[Any], int] | None:
    """The shape, dtype and data offset of an integer `.npy` object, from its header; None
    for anything else.

    Raises:
        DataError: naming `dataset` and `shard`, when the values the header says it holds end
            past the object's listed size (a longer object is read, as a local file is), or
            the object changed or went since it was listed (see `read_listed`).
        StorageError: the store failed (see `read_listed`).
    """
    fs_path, item = objects[url]

    def header() -> tuple[tuple[int, ...], np.dtype[Any], int] | None:
        wanted = min(item.size, _HEADER_BYTES)
        head = cat_range(fs, fs_path, 0, wanted, policy, listed=item.size)
        if len(head) < wanted:  # shorter than listed: a DataError naming `shard` if changed
            check_unchanged(fs, fs_path, item, dataset=dataset, retry=policy, shard=shard)
        handle = io.BytesIO(head)
        try:
            found = read_header(handle)
        except ValueError:
            return None
        return (found.shape, found.dtype, handle.tell()) if found.dtype.kind in "iu" else None

    what = "reading the header"
    found = read_listed(
        header, fs, fs_path, item, dataset=dataset, retry=policy, what=what, shard=shard
    )
    if found is not None:
        shape, dtype, start = found
        end = start + math.prod(shape) * dtype.itemsize
        if end > item.size:
            raise DataError(
                f"{os.path.basename(url)!r} is shorter than its .npy header says: shape "
                f"{shape} of {dtype} from byte {start} needs {end} bytes, and it has "
                f"{item.size}",
                dataset=dataset,
                shard=shard,
            )
    return found


def _npy_value(
    url: str,
    objects: Objects,
    position: int,
    *,
    dtype: np.dtype[Any],
    fs: Any,
    policy: RetryPolicy,
    dataset: str,
    shard: str,
) -> int:
    """One integer of a `.npy` object at a byte position, by a range read.

    Raises:
        DataError: at once (not retried), naming `dataset` and `shard`, for fewer bytes than
            the value's: the object is shorter than it was listed.
    """
    fs_path, item = objects[url]

    def value() -> int:
        end = position + dtype.itemsize
        data = cat_range(fs, fs_path, position, end, policy, listed=item.size)
        if len(data) == item.size >= end:  # a server that ignores ranges sends it whole
            data = data[position:end]
        if len(data) != dtype.itemsize:
            raise DataError(
                f"{os.path.basename(url)!r} gave {len(data)} of the {dtype.itemsize} bytes of "
                f"its value at byte {position}, within the {item.size} bytes it was listed "
                "with (did it change after it was listed?)",
                dataset=dataset,
                shard=shard,
            )
        return int(np.frombuffer(data, dtype=dtype, count=1)[0])

    what = "reading the offsets"
    return read_listed(
        value, fs, fs_path, item, dataset=dataset, retry=policy, what=what, shard=shard
    )


def remembered_layout(index_cache_dir: str, item: CachedObject, format_: str) -> Layout | None:
    """The row count (and, for a Parquet object, its row-group sizes and columns; for a Vortex
    one, its columns) remembered for this version of the object read as `format_`, else None:
    always for an object listed without a version (a rewrite of the same size could not be told
    apart), for a record counted as another format (the object read with another `format=`:
    the line count of a Parquet file read as JSONL, or the reverse, was taken for its rows,
    where a local open reads the file itself), for a Vortex record without columns, and for a
    Parquet record with sizes of another estimate (see `parquet.ESTIMATE_VERSION`). Window
    blocks are derived from the sizes at each open, so a new block size never meets stale
    blocks; a record from before formats were kept is told by its columns, which Parquet and
    Vortex records hold and JSONL ones do not."""
    if not item.version:
        return None
    parquet, schema = format_ == "parquet", format_ in SCHEMA_FORMATS
    with (
        contextlib.suppress(OSError, ValueError, KeyError, TypeError),
        open(_record(index_cache_dir, item), encoding="utf-8") as handle,
    ):
        record = json.load(handle)
        counted = record.get("format")
        if counted is None:  # kept before formats were: told by its columns
            if bool(record.get("columns")) != schema:
                return None
        elif counted != format_:
            return None
        if not schema:
            _used(handle.name)
            return int(record["rows"]), (), ()
        if parquet and record["estimate"] != ESTIMATE_VERSION:
            return None
        groups = tuple((int(rows), int(nbytes)) for rows, nbytes in record["groups"])
        columns = tuple((str(n), str(t), bool(i)) for n, t, i in record["columns"])
        if not (parquet or columns):  # a Vortex record from before columns were kept
            return None
        _used(handle.name)
        return int(record["rows"]), groups, columns
    return None


def _used(record: str) -> None:
    """Marks a record read now: kept from the tidy (see `_tidy`)."""
    with contextlib.suppress(OSError):
        os.utime(record)


def remember_layout(
    index_cache_dir: str,
    item: CachedObject,
    format_: str,
    rows: int,
    groups: Groups = (),
    columns: Columns = (),
) -> None:
    """Remembers the object's row count as read in `format_`, its row-group sizes and columns
    (none for other formats); a folder that cannot be written is skipped, and so is an object
    listed without a version (ETag, time), which is counted again at every open."""
    if not item.version:
        return
    with contextlib.suppress(OSError):
        record = {
            "url": item.url,
            "format": format_,
            "rows": rows,
            "groups": groups,
            "columns": columns,
            "estimate": ESTIMATE_VERSION,
        }
        write_text_atomically(_record(index_cache_dir, item), json.dumps(record))
    _tidy(os.path.join(index_cache_dir, _ROW_COUNTS))


_UNUSED_S = 7 * 24 * 3600  # a record unread this long goes (its object rewritten, or gone)
_TIDY_S = 600.0  # a process tidies a folder of records at most this often
_TIDIED: dict[str, float] = {}  # folder -> when this process last tidied it
_TIDYING = threading.Lock()


def _tidy(folder: str) -> None:
    """At most once per `_TIDY_S` per process, as a record is written: removes the records of
    `folder` that no open has read for `_UNUSED_S`. Each new version of an object gets a
    record of its own, so a dataset rewritten again and again left one per version for ever
    (the line indexes of downloads go the same way, see `_line_index._tidy`). A record
    removed while still of use costs its next open one count (a footer's range read)."""
    now = time.time()
    with _TIDYING:
        last = _TIDIED.get(folder)
        if last is not None and now - last < _TIDY_S:
            return
        _TIDIED[folder] = now
    unused = now - _UNUSED_S
    with contextlib.suppress(OSError), os.scandir(folder) as listing:
        for entry in listing:
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue  # a write's temporary (see `write_text_atomically`)
            with contextlib.suppress(OSError):  # another process's tidy took it first
                if entry.stat(follow_symlinks=False).st_mtime < unused:
                    os.unlink(entry.path)


# taken by the forking thread over a fork, so that no other thread holds it in the child
os.register_at_fork(
    before=_TIDYING.acquire,
    after_in_parent=_TIDYING.release,
    after_in_child=_TIDYING.release,
)


def _record(index_cache_dir: str, item: CachedObject) -> str:
    return os.path.join(index_cache_dir, _ROW_COUNTS, f"{item.name}.json")
