"""A dataset's reader under other settings, for `Dataset.with_io_options` and `Dataset.reading`.

Each gives a new reader, its caches empty, only where a setting changes, else the reader itself
(the dataset then stays the same object). A local dataset takes only the settings its reader
reads by (Parquet, MDS, a JSONL one's cache); narrowing to the fields a recipe reads applies to
the formats that skip unread columns (Parquet, Vortex, MDS, LitData).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon_torch.io._io_options import IoOptions, MdsOptions, ParquetOptions
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import ProjectedReader, Projection
from zephon_torch.io._remote_reader import RemoteReader
from zephon_torch.io.formats import ShardReader
from zephon_torch.io.jsonl import JsonlReader
from zephon_torch.io.mds import MdsReader
from zephon_torch.io.parquet import ParquetReader

_NARROWED = ("parquet", "vortex", "mds", "litdata")  # formats that skip unread columns
_TOKEN_LISTS = ("parquet", "vortex")  # whose token columns save a Python int an id


def with_io_options(
    reader: ShardReader, format_: str, io_options: Mapping[str, Any] | IoOptions
) -> ShardReader:
    """The reader of a dataset of format ``format_`` read by ``reader``, with ``io_options``
    (see `Dataset.with_io_options`); ``reader`` itself where they change nothing it reads by.

    Raises:
        ConfigError: for unknown keys or bad values.
    """
    if not isinstance(reader, RemoteReader):
        if isinstance(reader, ParquetReader):  # merged over its own bound
            bound = ParquetOptions(row_group_cache_bytes=reader.max_row_group_bytes)
            wanted = IoOptions(parquet=bound).merged(io_options).parquet
            if wanted != bound:
                reader = reader.resized(wanted.row_group_cache_bytes)
        elif isinstance(reader, MdsReader):  # merged over its own setting
            checks = MdsOptions(verify_hashes=reader.verify_hashes)
            asked = IoOptions(mds=checks).merged(io_options).mds
            if asked != checks:
                reader = reader.verifying(asked.verify_hashes)
        else:
            IoOptions.of(io_options)  # validates
            sets_cache = isinstance(io_options, IoOptions) or "cache" in io_options
            if sets_cache and format_ == "jsonl":
                reader = with_jsonl_cache(reader, io_options)
        return reader
    return reader.with_settings(options=reader.options.merged(io_options))


def narrowed(
    reader: ShardReader, format_: str, fields: Sequence[str], token_field: str | None
) -> ShardReader:
    """The reader of a dataset of format ``format_`` read by ``reader``, reading only
    ``fields``, ``token_field`` as a token column (see `Dataset.reading`); ``reader`` itself
    where that reads no less."""
    projection = getattr(reader, "projection", None)
    if format_ not in _NARROWED or not isinstance(projection, Projection):
        return reader
    assert isinstance(reader, PickledAsSettings)
    columns = projection.columns or tuple(dict.fromkeys(fields))
    tokens = projection.token_columns
    if token_field in columns and token_field not in tokens and format_ in _TOKEN_LISTS:
        tokens = (*tokens, token_field)
    wanted = Projection(columns=columns, token_columns=tokens)
    if wanted == projection:
        return reader
    return reader.with_settings(projection=wanted)


def with_jsonl_cache(reader: ShardReader, io_options: Mapping[str, Any] | IoOptions) -> ShardReader:
    """A local JSONL dataset's reader (projected or not) whose compressed shards are
    decompressed into the shard cache of `io_options` merged over its own; its caches empty."""
    projected = reader if isinstance(reader, ProjectedReader) else None
    jsonl = projected.reader if projected is not None else reader
    if not isinstance(jsonl, JsonlReader):
        raise TypeError(f"a local JSONL dataset reads with a JsonlReader, not {jsonl!r}")
    fresh = jsonl.with_cache(IoOptions(cache=jsonl.cache).merged(io_options).cache)
    if projected is None:
        return fresh
    return ProjectedReader(fresh, projection=projected.projection, dataset=projected.dataset)
