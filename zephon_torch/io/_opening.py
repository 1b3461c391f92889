"""Opening a dataset: its files found (a local path or glob, hf://, any fsspec URL), the
format's reader made, and each file's row count (and window blocks) read.

Metadata only, overlapped over threads: Parquet footers, `.npy` headers, MDS and LitData
`index.json`, and JSONL line indexes built by one scan per file version and then cached on
disk (a second open of unchanged files costs a few stat calls a shard). Remote files are
listed once; their counts are read by range reads or remembered (see `_remote_rows`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from zephon_torch._caller import adopt_site, user_site, warn
from zephon_torch._progress import track
from zephon_torch.errors import DataError, without_secrets
from zephon_torch.io._discover import detect_files, find_files
from zephon_torch.io._io_options import IoOptions
from zephon_torch.io._projection import Projection
from zephon_torch.io._remote import Listing, is_remote, list_remote
from zephon_torch.io._remote_reader import RemoteReader
from zephon_torch.io._remote_sizing import opening_threads
from zephon_torch.io._versions import per_open_index_dir, versioned_per_open
from zephon_torch.io.formats import ShardReader, open_reader
from zephon_torch.io.parquet import ParquetReader

_MAX_OPENING_THREADS = 8
_MAX_REMOTE_OPENING_THREADS = 16

File = tuple[str, int, tuple[int, ...]]  # path, rows, window blocks


@dataclass(frozen=True)
class Opened:
    """A dataset as opened: its format, its files with their row counts and window blocks
    (those without rows left out, see `_without_empty_tables`), the reader, and the hub
    commit of an hf:// dataset."""

    format: str
    files: list[File]
    reader: ShardReader
    revision: str | None


@contextmanager
def naming(name: str) -> Iterator[None]:
    """A `DataError` raised inside that names no dataset (one of the discovery, which knows
    none: a damaged index) is raised again naming ``name``."""
    try:
        yield
    except DataError as error:
        if error.dataset is not None:
            raise
        raise DataError(error.detail, dataset=name, shard=error.shard, row=error.row) from None


def open_path(
    name: str,
    path: str,
    format_: str | None,
    projection: Projection,
    index_cache_dir: str,
    storage_options: Mapping[str, Any],
    options: IoOptions,
) -> Opened:
    """Opens the files at `path` (see `Dataset.from_path`, whose errors these are, raised
    within `naming(name)`)."""
    if is_remote(path):
        return _open_remote(
            name, path, format_, projection, index_cache_dir, storage_options, options
        )
    revision: str | None = None
    if path.startswith("hf://"):
        from zephon_torch.io._hf import list_hf
        from zephon_torch.io._hf_cache import resolve_hf

        online = list_hf(
            path, format_=format_, storage_options=storage_options, retry=options.retry
        )
        if online is not None:  # read from the hub shard by shard, like any remote URL
            root, listing = online
            return _open_remote(
                name,
                root,
                format_,
                projection,
                index_cache_dir,
                storage_options,
                options,
                listing=listing,
            )
        where, local_files, revision = resolve_hf(path, format_)
        if format_ is None:
            detected, found = detect_files(path, where, local_files)
        else:
            detected, found = format_, local_files
    else:
        skipped = (index_cache_dir, options.cache.directory)  # the index and shard caches
        detected, found = find_files(path, format_=format_, exclude=skipped)
    reader, files = open_reader(
        detected,
        found,
        dataset=name,
        index_cache_dir=index_cache_dir,
        projection=projection,
        row_group_cache_bytes=options.parquet.row_group_cache_bytes,
        cache=options.cache,
        verify_hashes=options.mds.verify_hashes,
    )
    laid_out = _without_empty_tables(name, detected, _layouts(reader, files))
    return Opened(format=detected, files=laid_out, reader=reader, revision=revision)


def _open_remote(
    name: str,
    url: str,
    format_: str | None,
    projection: Projection,
    index_cache_dir: str,
    storage_options: Mapping[str, Any],
    options: IoOptions,
    *,
    listing: Listing | None = None,
) -> Opened:
    if listing is None:
        listing = list_remote(
            url, format_=format_, storage_options=storage_options, retry=options.retry
        )
    objects = versioned_per_open(listing.objects, name)
    if objects is not listing.objects:  # counted at this open only: kept nowhere after it
        index_cache_dir = per_open_index_dir()
    reader = RemoteReader(
        dataset=name,
        format_=listing.format,
        url=url,
        objects=objects,
        storage_options=storage_options,
        options=options,
        index_cache_dir=index_cache_dir,
        projection=projection,
        index=listing.index,
        index_data=listing.index_data,
        fs=listing.fs,
        companions=listing.companions,
    )
    laid_out = _without_empty_tables(name, listing.format, _layouts(reader, reader.shard_urls))
    # an hf:// listing's root names the commit it was read at: hf://datasets/org/name@sha
    revision = url.rsplit("@", 1)[-1] if url.startswith("hf://") else None
    return Opened(format=listing.format, files=laid_out, reader=reader, revision=revision)


def _layouts(reader: ShardReader, files: list[str]) -> list[File]:
    """Each file with its row count (and window blocks, for the readers that split shards)."""
    if isinstance(reader, (ParquetReader, RemoteReader)):
        layout = reader.shard_layout
    else:

        def layout(path: str) -> tuple[int, tuple[int, ...]]:
            return reader.num_rows(path), ()

    # Footers and index scans of many shards overlap well: both wait on I/O or run numpy,
    # zlib or zstd code that releases the GIL. Remote ones mostly wait on the network, so
    # they use more threads than there are cores.
    if len(files) == 1:
        layouts = [layout(files[0])]
    else:
        if isinstance(reader, RemoteReader):
            threads = opening_threads(
                _MAX_REMOTE_OPENING_THREADS,
                format_=reader.format,
                objects=reader.objects,
                cache=reader.options.cache,
            )
            workers = min(threads, len(files))
        else:
            workers = min(_MAX_OPENING_THREADS, len(files), os.cpu_count() or 1)
        with ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="zephon-open",
            initializer=adopt_site,  # its warnings point at the user's line that opens
            initargs=(user_site(),),
        ) as pool:
            # a bar on a terminal: the first open of many JSONL shards scans them all
            layouts = list(track(pool.map(layout, files), "opening shards", total=len(files)))
    return [(file, rows, blocks) for file, (rows, blocks) in zip(files, layouts, strict=True)]


def _without_empty_tables(name: str, format_: str, files: list[File]) -> list[File]:
    """``files`` less the Parquet, Vortex and ``.npy`` files without rows, with a warning
    naming them: complete files of an empty partition (Spark, Dask and ``ParquetWriter`` write
    them; a tokenizing worker that got no document, a ``.npy`` of offsets ``[0]``), not damage,
    as an empty JSONL file may be. Where every file is empty, the dataset's "has no rows" error
    names the first."""
    empty = [path for path, rows, _ in files if rows <= 0]
    if format_ not in ("parquet", "vortex", "npy") or not empty or len(empty) == len(files):
        return files
    named = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
    named = without_secrets(named)  # signed URLs
    warn(
        f"dataset {name!r}: {len(empty)} of its {len(files)} {format_} files hold no rows and "
        f"are left out: {named}",
    )
    return [file for file in files if file[1] > 0]
