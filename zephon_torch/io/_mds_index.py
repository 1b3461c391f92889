"""The shard entries of an MDS `index.json`, each value checked for its type and range.

A damaged or hand-edited index is then one error at open naming it (a ValueError the reader
turns into "cannot read this MDS index", or a DataError naming the shard), never a TypeError
at a later read or a row quietly taken from the wrong column. mosaicml-streaming's MDSWriter
writes `zip_data` exactly when it records a `compression`; a shard with only `raw_data` is read
as plain, as streaming reads it, but the compression must still be one it knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_torch.io._compression import MDS_CODECS
from zephon_torch.io._hashes import recorded_hashes
from zephon_torch.io._index import MAX_ITEMS, check_listed_once, recorded_count, shard_path


@dataclass(frozen=True)
class Entry:
    """One shard of the index: its file, counts, codec and columns."""

    path: str
    samples: int
    raw_bytes: int  # the shard's size decompressed
    stored_bytes: int | None  # a compressed shard's file size (`zip_data`); None for a plain one
    codec: str | None  # "zstd", "gz", ...; None for a plain shard
    names: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]  # None for a column of variable size
    hashes: dict[str, str]  # of the file as stored


def shard_entries(index: dict[str, Any], *, index_path: str, dataset: str) -> list[Entry]:
    """The index's shards, in order, each file listed once.

    Raises:
        ValueError: for a field missing or of the wrong type, columns that do not line up,
            a duplicate column name, or an unknown compression.
        DataError: naming the shard, for a name outside the dataset folder, a missing local
            file, a file listed twice, or a count that is not a whole number >= 0.
    """
    shards = index["shards"]
    if not isinstance(shards, list):
        raise ValueError(f"shards is {type(shards).__name__}, not a list")
    entries = [_entry(entry, index_path=index_path, dataset=dataset) for entry in shards]
    check_listed_once([entry.path for entry in entries], dataset=dataset)
    return entries


def _entry(entry: Any, *, index_path: str, dataset: str) -> Entry:
    if not isinstance(entry, dict) or entry.get("format") != "mds":
        format_ = entry.get("format") if isinstance(entry, dict) else entry
        raise ValueError(f"a shard has format {format_!r}, not 'mds'")
    raw, packed = entry["raw_data"], entry.get("zip_data")
    if not isinstance(raw, dict) or not isinstance(packed, dict | None):
        raise ValueError("a shard's raw_data or zip_data is not an object")
    basename = (packed or raw)["basename"]
    if not isinstance(basename, str):
        raise ValueError(f"a shard's basename is {basename!r}, not a str")
    path = shard_path(index_path, basename, dataset=dataset)
    names = _strings(entry["column_names"], "column_names", path)
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"duplicate column name {duplicate!r} in column_names of {path!r}")
    encodings = _strings(entry["column_encodings"], "column_encodings", path)
    sizes = entry["column_sizes"]
    if not isinstance(sizes, list) or not all(_is_size(size) for size in sizes):
        raise ValueError(f"column_sizes of {path!r} are {sizes!r}, not whole numbers >= 0 or null")
    if not len(names) == len(encodings) == len(sizes):
        raise ValueError(
            f"{path!r} has {len(names)} column_names, {len(encodings)} column_encodings and "
            f"{len(sizes)} column_sizes"
        )
    return Entry(
        path=path,
        samples=recorded_count(
            entry["samples"], "samples", dataset=dataset, shard=path, most=MAX_ITEMS
        ),
        raw_bytes=recorded_count(raw["bytes"], "raw bytes", dataset=dataset, shard=path),
        stored_bytes=None
        if packed is None or "bytes" not in packed
        else recorded_count(packed["bytes"], "zip bytes", dataset=dataset, shard=path),
        codec=_codec(entry.get("compression"), packed is not None, path),
        names=names,
        encodings=encodings,
        sizes=tuple(sizes),
        hashes=recorded_hashes(packed or raw),
    )


def _codec(compression: object, packed: bool, path: str) -> str | None:
    """The codec of a shard's file: None for a plain one (no `zip_data`)."""
    if not isinstance(compression, str | None):
        raise ValueError(f"compression of {path!r} is {compression!r}, not a str or null")
    codec = (compression or "").partition(":")[0] or None
    if codec is not None and codec not in MDS_CODECS:
        raise ValueError(
            f"{path!r} has compression {compression!r}, not one of {', '.join(MDS_CODECS)}"
        )
    if packed and codec is None:
        raise ValueError(f"{path!r} has zip_data but no compression")
    return codec if packed else None


def _strings(values: object, field: str, path: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ValueError(f"{field} of {path!r} are {values!r}, not a list of str")
    return tuple(values)


def _is_size(size: object) -> bool:
    return size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 0)
