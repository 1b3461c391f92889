"""The shard reader protocol and the file formats `Dataset.from_path` knows.

A reader turns (shard path, row numbers) into row dicts for one dataset. It owns its caches,
is safe to call from many threads, and pickles without them (workers reopen lazily), so a
`Dataset` can hold one and still be sent to DataLoader worker processes.
"""

from __future__ import annotations

from typing import Any, Protocol

from zephon_torch.errors import ConfigError
from zephon_torch.io._rows import Rows

FILE_FORMATS = ("jsonl", "parquet")
"""The formats `Dataset.from_path` reads, sorted."""

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_COMPRESSION_SUFFIXES = ("", ".gz", ".zst")
EXTENSIONS: dict[str, str] = {
    **{
        f"{suffix}{compression}": "jsonl"
        for suffix in _JSONL_SUFFIXES
        for compression in _COMPRESSION_SUFFIXES
    },
    ".parquet": "parquet",
}
"""File name endings and the format each one means."""


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


def detect_format(path: str) -> str | None:
    """Returns the format a file name's extension means, or None when it means none."""
    lower = path.lower()
    matches = [ending for ending in EXTENSIONS if lower.endswith(ending)]
    return EXTENSIONS[max(matches, key=len)] if matches else None


def check_format(format_: str) -> str:
    """Returns `format_` when `from_path` can read it, else raises ConfigError listing those."""
    if format_ not in FILE_FORMATS:
        raise ConfigError(
            f"`format` must be one of {', '.join(repr(f) for f in FILE_FORMATS)}, got {format_!r}"
        )
    return format_


def make_reader(format_: str, *, dataset: str, index_cache_dir: str) -> ShardReader:
    """Builds the reader of a file format for one dataset.

    Args:
        format_: one of `FILE_FORMATS`.
        dataset: the dataset name, used in error messages.
        index_cache_dir: where JSONL line indexes are cached.

    Returns:
        A new reader with empty caches.
    """
    if check_format(format_) == "jsonl":
        from zephon_torch.io.jsonl import JsonlReader

        return JsonlReader(dataset=dataset, index_cache_dir=index_cache_dir)
    from zephon_torch.io.parquet import ParquetReader

    return ParquetReader(dataset=dataset)
