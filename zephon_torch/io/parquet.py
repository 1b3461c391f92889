"""Random access to rows of Parquet shards, one decoded row group at a time.

Row counts, and the split of big shards into window blocks (`window_blocks`), come from the
footer, so opening a dataset reads no data. Parquet cannot decode a single row, so a read
decodes each row group it touches to Python lists once and keeps it in an LRU bounded by the
groups' uncompressed size (256 MiB by default; Python objects take a few times more), each
group weighing `GROUP_OVERHEAD` more for its objects. A window of rows drawn from a few shards,
or blocks of at most `WINDOW_BLOCK_BYTES` of big shards, then costs one conversion per row
group, not one per request, as long as the window's row groups fit the bound: when they do not
(row groups bigger than a block, or more window shards), rows drawn at random from the window
decode a group for a few rows each, and in a dataset of many windows a warning says so once
(groups decoded again and again; see `_DecodeLog`). A bound by count (16, then 1,024 groups)
made windows of many small row groups (short documents) decode a group for about every row,
whatever the byte bound: at 1,024, 6x slower over windows of 12,000 groups of 10 rows.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_torch._caller import warn
from zephon_torch.errors import DataError
from zephon_torch.io._arrow import (
    BadTokenRow,
    TokenColumn,
    check_schema,
    column_bytes,
    row_columns,
)
from zephon_torch.io._cache import LruCache
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import Projection
from zephon_torch.io._rows import (
    CHANGED_NOTE,
    Rows,
    as_row_array,
    check_in_range,
    machine_fault,
    utf8_name,
)

WINDOW_BLOCK_BYTES = 32 << 20
"""A Parquet shard whose row groups hold more than this many bytes (see `decoded_bytes`) is
split into blocks of consecutive row groups of at most this size (a bigger group alone), which
shuffle windows count in place of shards (see `window_blocks`): a window of 4 blocks needs at
most half the default row-group cache, leaving the rest to the next window's first groups and
to estimates that fall short. Data-affecting: it sets the order."""

GROUP_OVERHEAD = 1 << 10
"""What a decoded row group weighs in the cache beyond its data, its Python objects (0.7 to 1.6
KiB measured for groups of 1 to 10 short rows): the byte bound also bounds many tiny groups."""

_FIXED_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def decoded_bytes(group: pq.RowGroupMetaData) -> int:
    """A row group's size once decoded, from its footer, over all columns (so that it does not
    depend on the columns read): a fixed-width column's values at their width, as token arrays
    hold them, and any other column's uncompressed pages. The footer's uncompressed size alone
    falls short for dictionary-encoded values: token ids below 65,536 stored as int32 take 2
    bytes there, 4 decoded."""
    total = 0
    for i in range(group.num_columns):
        chunk = group.column(i)
        width = _FIXED_WIDTHS.get(chunk.physical_type, 0)
        total += max(int(chunk.total_uncompressed_size), int(chunk.num_values) * width)
    return total


ESTIMATE_VERSION = 1
"""Changes whenever `decoded_bytes` estimates differently, so that sizes remembered for remote
shards by an older rule are measured again rather than reused."""


def group_sizes(metadata: pq.FileMetaData) -> tuple[tuple[int, int], ...]:
    """Each row group's row count and `decoded_bytes`, from a footer."""
    groups = (metadata.row_group(i) for i in range(metadata.num_row_groups))
    return tuple((int(group.num_rows), decoded_bytes(group)) for group in groups)


def window_blocks(groups: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The row counts of a shard's window blocks, given its row groups' rows and decoded bytes
    (`group_sizes`): runs of consecutive row groups of at most `WINDOW_BLOCK_BYTES`, a bigger
    group alone, an empty group with the run before it (or after, at the start). Empty when
    the whole shard fits one block.

    A shuffle window of `shuffle_window_shards` whole shards of hub size (hundreds of MB)
    would hold GBs of row groups, far above the row-group cache, and most rows would cost a
    row-group decode; windows of blocks bound the decoded data a window needs whatever the
    shard size (but a single row group above the block size stays whole).
    """
    if sum(nbytes for _, nbytes in groups) <= WINDOW_BLOCK_BYTES:
        return ()
    blocks: list[int] = []
    rows = size = 0
    for count, nbytes in groups:
        if rows and count and size + nbytes > WINDOW_BLOCK_BYTES:
            blocks.append(rows)
            rows = size = 0
        rows += count
        size += nbytes
    blocks.append(rows)
    return tuple(blocks) if len(blocks) > 1 else ()


@dataclass(frozen=True)
class _OpenFile:
    """A Parquet file with its footer read; `lock` serialises decoding on the one handle."""

    file: pq.ParquetFile
    lock: threading.Lock
    offsets: npt.NDArray[np.int64]  # first row of each row group, then the row count
    group_bytes: tuple[int, ...]
    blocks: tuple[int, ...]  # see `window_blocks`
    size: int  # the file's size when opened

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])


@dataclass(frozen=True)
class _RowGroup:
    """One row group as Python values (token columns as `TokenColumn`), column by column."""

    names: tuple[str, ...]
    columns: tuple[list[Any] | TokenColumn, ...]
    nbytes: int


class ParquetReader(PickledAsSettings):
    """Reads the Parquet shards of one dataset; thread-safe, and picklable without its caches.

    Args:
        dataset: the dataset name, used in error messages.
        max_open: how many files to keep open with their footers parsed.
        max_row_groups: how many decoded row groups to keep; None: as many as
            ``max_row_group_bytes`` holds.
        max_row_group_bytes: bound on the summed uncompressed size of the kept row groups, each
            with `GROUP_OVERHEAD`; the newest one is kept whatever its size.
        projection: the columns to read (None reads all) and the token columns, which come back
            as 1-D numpy integer arrays.
    """

    SETTINGS = (
        "dataset",
        "max_open",
        "max_row_groups",
        "max_row_group_bytes",
        "projection",
    )  # what it pickles as

    def __init__(
        self,
        *,
        dataset: str,
        max_open: int = 16,
        max_row_groups: int | None = None,
        max_row_group_bytes: int = 256 << 20,
        projection: Projection | None = None,
    ) -> None:
        self.dataset = dataset
        self.projection = projection or Projection()
        self.max_open = max_open
        self.max_row_groups = max_row_groups
        self.max_row_group_bytes = max_row_group_bytes
        self._open_caches()

    def _open_caches(self) -> None:
        self._files: LruCache[_OpenFile] = LruCache(self.max_open)
        count = self.max_row_groups or self.max_row_group_bytes // GROUP_OVERHEAD + 1
        self._groups: LruCache[_RowGroup] = LruCache(
            count, max_weight=self.max_row_group_bytes, weigh=lambda g: g.nbytes
        )
        self._decodes = _DecodeLog()

    def resized(self, max_row_group_bytes: int) -> ParquetReader:
        """A reader like this one with another bound on decoded row groups (caches empty)."""
        state = self.__getstate__()
        state["max_row_group_bytes"] = max_row_group_bytes
        reader = ParquetReader.__new__(ParquetReader)
        reader.__setstate__(state)
        return reader

    def num_rows(self, path: str) -> int:
        """Returns the row count recorded in the shard's footer; reads no data."""
        return self._file(path).num_rows

    def shard_layout(self, path: str) -> tuple[int, tuple[int, ...]]:
        """The shard's row count and window blocks (see `window_blocks`); reads no data."""
        opened = self._file(path)
        return opened.num_rows, opened.blocks

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the given rows of the shard as dicts of Python values, in the order asked.

        Args:
            path: the shard.
            rows: row numbers within the shard, any order, repeats allowed.

        Returns:
            One new dict per requested row; nested lists, dicts and token arrays are shared
            with the row group cache, so do not mutate them.

        Raises:
            DataError: for a row past the end of the shard, a row group that does not decode,
                or a row whose token column holds a null id.
        """
        opened = self._file(path)
        positions = as_row_array(rows)
        count = opened.num_rows
        check_in_range(positions, count, dataset=self.dataset, shard=path, note=CHANGED_NOTE)
        groups = np.searchsorted(opened.offsets, positions, side="right") - 1
        within = (positions - opened.offsets[groups]).tolist()
        decoded: dict[int, _RowGroup] = {}
        result: list[dict[str, Any]] = []
        for group, row in zip(groups.tolist(), within, strict=True):
            values = decoded.get(group)
            if values is None:
                values = decoded[group] = self._groups.get_or_load(
                    (path, group), partial(self._decode, path, opened, group)
                )
            try:
                if len(values.names) == 1:  # one column (token ids, typically): no zip
                    result.append({values.names[0]: values.columns[0][row]})
                else:
                    names, columns = values.names, values.columns
                    result.append(dict(zip(names, [c[row] for c in columns], strict=True)))
            except BadTokenRow as error:
                at = int(opened.offsets[group]) + row
                raise DataError(
                    f"row group {group}: {error} {at}", dataset=self.dataset, shard=path, row=at
                ) from None
        return result

    def _file(self, path: str) -> _OpenFile:
        return self._files.get_or_load(path, partial(self._open, path))

    def _open(self, path: str) -> _OpenFile:
        # A corrupt footer fails in pyarrow (ArrowException, OSError) or, a name that is not
        # UTF-8, as a UnicodeDecodeError (a ValueError) when the schema or a column is read.
        name = utf8_name(path, dataset=self.dataset, library="pyarrow")
        try:
            size = os.stat(path).st_size
            # pages written with checksums are verified (none written: nothing to verify)
            file = pq.ParquetFile(name, page_checksum_verification=True)
            self._check_columns(path, file.schema_arrow)
            metadata = file.metadata
            groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
            fields = set(file.schema_arrow.names)
            group_bytes = tuple(self._group_bytes(group, fields) for group in groups)
        except DataError:  # the projection's, naming the column (a ValueError too)
            raise
        except (pa.ArrowException, OSError, ValueError) as error:
            if machine_fault(error):
                raise
            raise DataError(
                f"not a readable Parquet file: {error}", dataset=self.dataset, shard=path
            ) from error
        offsets = np.zeros(len(groups) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([group.num_rows for group in groups], dtype=np.int64)
        return _OpenFile(
            file=file,
            lock=threading.Lock(),
            offsets=offsets,
            group_bytes=group_bytes,
            blocks=window_blocks(group_sizes(metadata)),
            size=size,
        )

    def _group_bytes(self, group: pq.RowGroupMetaData, fields: set[str]) -> int:
        """The uncompressed size of the group's columns that are read as Python values; token
        columns are weighed by their decoded arrays instead (see `column_bytes`). ``fields``:
        the file's top-level field names."""
        columns, tokens = self.projection.columns, self.projection.token_columns
        chunks = (group.column(i) for i in range(group.num_columns))
        return sum(
            int(chunk.total_uncompressed_size)
            for chunk in chunks
            if (name := _top_field(chunk.path_in_schema, fields)) not in tokens
            and (columns is None or name in columns)
        )

    def _check_columns(self, path: str, schema: pa.Schema) -> None:
        check_schema(self.projection, schema, dataset=self.dataset, shard=path)

    def _decode(self, path: str, opened: _OpenFile, group: int) -> _RowGroup:
        if self._decodes.again_soon((path, group)):
            warn(
                f"dataset {self.dataset!r}: Parquet row groups are decoded again soon after "
                f"being dropped from the row-group cache ({self.max_row_group_bytes >> 20} MiB): "
                "the row groups of a shuffle window do not fit "
                "it, so most rows cost a row-group decode. Lower shuffle_window_shards, write "
                "smaller row groups, or raise io_options={'parquet': {'row_group_cache_bytes': "
                "...}}.",
            )
        columns = None if self.projection.columns is None else list(self.projection.columns)
        try:
            with opened.lock:
                table = opened.file.read_row_group(group, columns=columns)
            if columns is not None:
                # pyarrow also reads a dotted name as a path into a struct: with a column
                # "meta.src" beside a struct "meta", both came back
                table = table.select(columns)
            names, values = row_columns(table, self.projection.token_columns)
        except (pa.ArrowException, OSError, ValueError) as error:
            if machine_fault(error):  # no memory for the group (pyarrow's MemoryError too)
                raise
            raise DataError(
                f"cannot decode row group {group}: {error}{_changed(path, opened.size)}",
                dataset=self.dataset,
                shard=path,
            ) from error
        return _RowGroup(
            names=names,
            columns=values,
            nbytes=column_bytes(values, opened.group_bytes[group]) + GROUP_OVERHEAD,
        )


def _changed(path: str, size: int) -> str:
    """What a failed decode adds where the file is not the size it was when opened (cut short,
    or rewritten, since): its rows are not those the dataset was opened with."""
    try:
        now: int | None = os.stat(path).st_size
    except OSError:
        now = None
    if now == size:
        return ""
    what = "gone" if now is None else f"{now} bytes"
    return (
        f"; the shard file is {what} now, {size} when the dataset was opened: it changed "
        "since (a shard must not change while it is read; replace one by renaming a new file "
        "over it, and open the dataset again)"
    )


class _DecodeLog:
    """When each row group was decoded, to tell a cache too small for the shuffle window.

    A decode is a thrash when the group was decoded twice before within a quarter as many
    decodes as there are groups seen: dropped and needed again, over and over, in the same
    window. A new pass brings a group back early at most once (last in one pass, first in the
    next), never twice, as a pass decodes (nearly) every group. The verdict is taken per block
    of ``_BLOCK`` decodes, not over the process's life: a block of which half are thrashes
    means the window's groups do not fit. It tells only a dataset of many windows (whose
    groups seen far outnumber a window's): with two or three windows, a thrash and a new pass
    look alike by timing. Thread-safe; a forked child starts afresh, as the caches do.

    Bounded: it keeps the ``_MAX_SEEN`` groups decoded last (about 12 MiB), and nothing once it
    has warned. Over a larger dataset a thrash is then a group decoded twice within
    ``_MAX_SEEN / 4`` decodes, far more than a window holds.
    """

    _BLOCK = 256
    _MAX_SEEN = 1 << 16

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._count = 0
        self._seen: dict[tuple[str, int], tuple[int, int]] = {}  # last two decodes' numbers
        self._block = [0, 0]  # decodes and thrashes in the current block
        self._warned = False

    def again_soon(self, key: tuple[str, int]) -> bool:
        """Record a decode of ``key``; True once, at the end of the first block of decodes of
        which half were thrashes."""
        if self._pid != os.getpid():
            self.__init__()  # type: ignore[misc]
        with self._lock:
            if self._warned:
                return False
            self._count += 1
            seen = self._seen
            before, last = seen.pop(key, (0, 0))
            seen[key] = (last, self._count)  # last in the dict's order: decoded last
            if len(seen) > self._MAX_SEEN:
                del seen[next(iter(seen))]
            block = self._block
            block[0] += 1
            if before and self._count - before < len(self._seen) // 4:
                block[1] += 1
            if block[0] < self._BLOCK:
                return False
            thrashing = 2 * block[1] >= block[0]
            self._block = [0, 0]
            if not thrashing:
                return False
            self._warned = True
            seen.clear()
            return True


def _top_field(path: str, fields: set[str]) -> str:
    """A leaf column's top-level field: the longest of ``fields`` its dotted path is, or
    starts with (a top-level name may hold a dot itself: "doc.text" is no struct's child)."""
    parts = path.split(".")
    prefixes = (".".join(parts[:end]) for end in range(len(parts), 0, -1))
    return next((prefix for prefix in prefixes if prefix in fields), parts[0])
