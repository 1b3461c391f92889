"""The shard reader protocol and the formats `Dataset.from_path` knows.

A reader turns (shard path, row numbers) into row dicts for one dataset. It owns its caches,
is safe to call from many threads, and pickles without them (workers reopen lazily), so a
`Dataset` can hold one and still be sent to DataLoader worker processes.

File formats are told by name endings. Indexed formats (MDS, LitData) are directories with an
`index.json` that lists the shards and their row counts; they are told apart by its content.
Readers of formats whose shard is more than one file (an index, an `.npy` offsets file) reach
their files through a `locate` hook, so a remote dataset can download each one into its cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io._index import INDEX_FILE, index_format
from zephon_torch.io._locate import Locate, local_file
from zephon_torch.io._projection import ProjectedReader, Projection
from zephon_torch.io._rows import Rows, TokenIds

if TYPE_CHECKING:
    from zephon_torch.io._io_options import CacheOptions

FILE_FORMATS = ("jsonl", "litdata", "mds", "npy", "parquet", "vortex")
"""The formats `Dataset.from_path` reads, sorted."""

INDEXED_FORMATS = ("litdata", "mds")
"""Formats stored as a directory whose `index.json` lists the shards."""

LOCATING_FORMATS = ("litdata", "mds", "npy")
"""Formats whose readers open files through their `locate` hook, given shard paths."""

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSION_ENDINGS = (".gz", ".gzip", ".zst", ".zstd")  # of JSON Lines, read by magic bytes
_COMPRESSION_SUFFIXES = ("", *COMPRESSION_ENDINGS)
EXTENSIONS: dict[str, str] = {
    **{
        f"{suffix}{compression}": "jsonl"
        for suffix in _JSONL_SUFFIXES
        for compression in _COMPRESSION_SUFFIXES
    },
    ".npy": "npy",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".parq": "parquet",
    ".vortex": "vortex",
}
"""File name endings and the format each one means."""
ENDINGS = (
    f"JSON Lines ({', '.join(_JSONL_SUFFIXES)}; gzip or zstd compressed too: "
    f"{', '.join(COMPRESSION_ENDINGS)}), .npy, Parquet (.parquet, .pq, .parq), .vortex"
)
"""The endings, as an error names them."""

__all__ = [
    "COMPRESSION_ENDINGS",
    "ENDINGS",
    "EXTENSIONS",
    "FILE_FORMATS",
    "INDEXED_FORMATS",
    "INDEX_FILE",
    "LOCATING_FORMATS",
    "ShardReader",
    "TokenReader",
    "check_format",
    "check_indexed",
    "detect_format",
    "index_format",
    "indexed_format",
    "make_reader",
    "open_reader",
    "token_reader",
]


class ShardReader(Protocol):
    """Reads the rows of one dataset's shards; every method is thread-safe."""

    def num_rows(self, path: str) -> int:
        """Returns the number of rows in the shard at `path`, reading as little as it can."""
        ...

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the given rows of the shard at `path`, in the order asked.

        Args:
            path: the shard.
            rows: row numbers (ints or an integer array), each in `[0, num_rows(path))`, in
                any order, repeats allowed.

        Returns:
            One new dict per requested row (nested values may be shared with a cache: do not
            mutate them).

        Raises:
            DataError: when a row cannot be decoded, naming the dataset, shard and row.
        """
        ...


class TokenReader(ShardReader, Protocol):
    """A reader of stored token ids (`.npy`, MDS and LitData arrays) that can hand over a
    row's ids without a row dict around them: a `ShardReader` with a `read_tokens` method."""

    def read_tokens(self, path: str, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """Returns the rows' `field` as a sequence of 1-D integer arrays (views of the stored
        ids; a list, or a `TokenSpans` of their places), in the order asked, where the shard
        stores them so and rows keep only that field; None otherwise (then `read` gives them,
        and names any row that does not decode)."""
        ...

    def maps_token_ids(self) -> bool:
        """Whether every shard's `read_tokens` arrays are views of a file mapped into memory:
        holding them, however many, holds no decoded copy of a shard (see `Dataset`'s)."""
        ...


def token_reader(reader: ShardReader) -> TokenReader | None:
    """`reader` as a `TokenReader` when it is one, else None (a cheap check: it runs once per
    shard of every pre-tokenized chunk)."""
    return reader if hasattr(reader, "read_tokens") else None  # type: ignore[return-value]


def detect_format(path: str) -> str | None:
    """Returns the format a file name's extension means, or None when it means none (an
    http(s) URL's by its path: a signed URL's query follows it)."""
    lower = path.lower()
    if lower.startswith(("http://", "https://")):
        lower = lower.split("?", 1)[0]
    matches = [ending for ending in EXTENSIONS if lower.endswith(ending)]
    return EXTENSIONS[max(matches, key=len)] if matches else None


def check_format(format_: str) -> str:
    """Returns `format_` when `from_path` can read it, else raises ConfigError listing those."""
    if format_ not in FILE_FORMATS:
        raise ConfigError(
            f"`format` must be one of {', '.join(repr(f) for f in FILE_FORMATS)}, got {format_!r}"
        )
    return format_


def make_reader(
    format_: str,
    *,
    dataset: str,
    index_cache_dir: str,
    projection: Projection | None = None,
    locate: Locate = local_file,
    max_open: int | None = None,
    row_group_cache_bytes: int | None = None,
    cache: CacheOptions | None = None,
) -> ShardReader:
    """Builds the reader of a file format (not an indexed one) for one dataset.

    Args:
        format_: one of `FILE_FORMATS` but `INDEXED_FORMATS`.
        dataset: the dataset name, used in error messages.
        index_cache_dir: where JSONL line indexes are cached.
        projection: the columns rows keep and the token columns; None keeps all.
        locate: how a reader of `LOCATING_FORMATS` turns a path into a local file.
        max_open: how many shards the reader keeps open or mapped; None: its default.
        row_group_cache_bytes: Parquet's bound on decoded row groups; None: its default.
        cache: the shard cache compressed JSONL shards are decompressed into; None: the
            default one.

    Returns:
        A new reader with empty caches.
    """
    projection = projection or Projection()
    sizing: dict[str, Any] = {} if max_open is None else {"max_open": max_open}
    format_ = check_format(format_)
    if format_ in INDEXED_FORMATS:
        raise ConfigError(f"format {format_!r} is a directory with an index: use `open_reader`")
    if format_ == "parquet":
        from zephon_torch.io.parquet import ParquetReader

        if row_group_cache_bytes is not None:
            sizing["max_row_group_bytes"] = row_group_cache_bytes
        return ParquetReader(dataset=dataset, projection=projection, **sizing)
    if format_ == "vortex":
        from zephon_torch.io.vortex import VortexReader

        return VortexReader(dataset=dataset, projection=projection, **sizing)
    if format_ == "npy":
        from zephon_torch.io.npy import NpyReader

        return NpyReader(dataset=dataset, projection=projection, locate=locate, **sizing)
    from zephon_torch.io.jsonl import JsonlReader

    reader = JsonlReader(dataset=dataset, index_cache_dir=index_cache_dir, cache=cache, **sizing)
    if projection == Projection():
        return reader
    return ProjectedReader(reader, projection=projection, dataset=dataset)


def open_reader(
    format_: str,
    files: Sequence[str],
    *,
    dataset: str,
    index_cache_dir: str,
    projection: Projection | None = None,
    locate: Locate = local_file,
    max_open: int | None = None,
    row_group_cache_bytes: int | None = None,
    cache: CacheOptions | None = None,
    verify_hashes: bool = False,
) -> tuple[ShardReader, list[str]]:
    """Builds a dataset's reader and lists its shards.

    Args:
        format_: one of `FILE_FORMATS`.
        files: what `find_files` found: the data files, or for an indexed format the one
            `index.json` (paths, or URLs with a remote `locate`).
        dataset: the dataset name, used in error messages.
        index_cache_dir: where JSONL line indexes are cached.
        projection: the columns rows keep and the token columns; None keeps all.
        locate: how a reader of `LOCATING_FORMATS` turns a path into a local file.
        max_open: how many shards the reader keeps open or mapped; None: its default.
        row_group_cache_bytes: Parquet's bound on decoded row groups; None: its default.
        cache: the shard cache compressed JSONL shards are decompressed into; None: the
            default one.
        verify_hashes: MDS only: check each shard against a hash `index.json` records.

    Returns:
        The reader and the shard paths, in order.

    Raises:
        ConfigError: for an indexed format given anything but one `index.json`.
        DataError: for an index that does not read, or lists missing shard files.
    """
    if format_ in INDEXED_FORMATS:
        if len(files) != 1 or os.path.basename(files[0]) != INDEX_FILE:
            raise ConfigError(
                f"format {format_!r} reads a directory holding {INDEX_FILE}, got {len(files)} "
                f"files, e.g. {files[0]!r}"
            )
        indexed: Any
        sizing = {} if max_open is None else {"max_open": max_open}
        if format_ == "mds":
            from zephon_torch.io.mds import MdsReader

            indexed = MdsReader(
                dataset=dataset,
                index_path=files[0],
                projection=projection,
                locate=locate,
                verify_hashes=verify_hashes,
                **sizing,
            )
        else:
            from zephon_torch.io.litdata import LitDataReader

            indexed = LitDataReader(
                dataset=dataset,
                index_path=files[0],
                projection=projection,
                locate=locate,
                **sizing,
            )
        return indexed, indexed.shard_paths
    reader = make_reader(
        format_,
        dataset=dataset,
        index_cache_dir=index_cache_dir,
        projection=projection,
        locate=locate,
        max_open=max_open,
        row_group_cache_bytes=row_group_cache_bytes,
        cache=cache,
    )
    if format_ == "npy":
        from zephon_torch.io.npy import OFFSETS_SUFFIX, NpyReader, token_files

        assert isinstance(reader, NpyReader)
        reader.offsets_files = frozenset(f for f in files if f.endswith(OFFSETS_SUFFIX))
        return reader, token_files(files)
    return reader, list(files)


def indexed_format(directory: str, format_: str | None) -> str | None:
    """Returns the indexed format of a directory holding `index.json`, else None.

    Args:
        directory: a directory.
        format_: the format the caller asked for; a non-indexed one skips the check.

    Raises:
        ConfigError: for an indexed `format_` that the index contradicts or that has no index.
    """
    if format_ is not None and format_ not in INDEXED_FORMATS:
        return None
    index = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(index):
        return check_indexed(None, format_, directory)
    return check_indexed(index_format(index), format_, directory, index)


def check_indexed(
    found: str | None, format_: str | None, directory: str, index: str | None = None
) -> str | None:
    """Returns `found`, the indexed format of a directory's `index.json` (None: none, or one
    at `index` that is not an MDS or LitData index), when it agrees with `format_`, the
    format asked for (None or one of `INDEXED_FORMATS`).

    Raises:
        ConfigError: for a `format_` that the index contradicts or that has no index.
        DataError: for a `format_` whose index at `index` does not read as one (naming the
            index as its shard, and no dataset: `Dataset.from_path` names it).
    """
    if format_ is not None and found != format_:
        if not found and index is not None:
            raise DataError(
                f"`format` is {format_!r} but the folder's {INDEX_FILE} does not read as an "
                "MDS or LitData index (damaged or cut short?)",
                shard=index,
            )
        what = f"a {found} index" if found else f"no {format_} {INDEX_FILE}"
        raise ConfigError(f"`format` is {format_!r} but {directory!r} holds {what}")
    return found
