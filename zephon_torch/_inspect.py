"""What ``zephon-torch inspect`` and ``zephon-torch index`` print: a dataset's facts, read cheaply.

``inspect`` opens a path like `Dataset.from_path` (footers, headers, cached line indexes) and
reads only the first shard's first rows for the field types and the preview, so it costs about
one dataset open plus one small read. ``index`` opens JSONL datasets so that every shard's line
index is built and cached; later opens of unchanged files then skip the scan. Other formats keep
their row counts in footers, headers or `index.json` and need no index. Errors that come from
the data, the settings (`ZephonError`, a missing fsspec package) or the machine (an `OSError`:
a file or folder that may not be read) are printed as one line and give exit code 2, never a
traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import numpy as np

from zephon_torch._words import counted
from zephon_torch.errors import DataError, StorageError, ZephonError
from zephon_torch.io import Dataset, parquet
from zephon_torch.io._remote_rows import SCHEMA_FORMATS
from zephon_torch.io._rows import name_line

ERROR_EXIT = 2
_MAX_CHARS = 200
_MAX_ITEMS = 8
_MAX_DEPTH = 4  # lists nested deeper show as `list[...]`: JSON may nest hundreds of levels
_SHARDS_LISTED = 10
_INDEXED = "jsonl"
_WRITABLE = "pass a writable --index-cache-dir"


def run_inspect(
    path: str,
    *,
    format_: str | None = None,
    rows: int = 3,
    index_cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
    columns: list[str] | None = None,
    validate: bool = False,
    text_field: str | None = None,
    token_field: str | None = None,
    chat_field: str | None = None,
    vocab_size: int | None = None,
    show_errors: int = 10,
    out: TextIO | None = None,
) -> int:
    """Prints a dataset's format, shards, rows, field types and first rows; returns the exit code.

    Args:
        path: a local path, glob or fsspec URL, as for `Dataset.from_path`.
        format_: the format, or None to detect it.
        rows: rows to preview (0 for none); they also give the field types.
        index_cache_dir: where line indexes and remembered row counts go (default: the
            library's).
        storage_options: passed to the fsspec file system of a URL.
        columns: the fields to read (default all): leaves out one that is not read, such as
            an MDS `pkl` column.
        validate: then read every row, checking `text_field`, `token_field` (its ids in
            `[0, vocab_size)`, else `[0, 2**31)`) or `chat_field` (conversations) in each
            (see `zephon_torch._validate`), and print each bad row (up to `show_errors`); a
            path that does not open as a whole for a damaged file is read file by file, the
            damaged ones reported.
        out: where to print (default stdout); errors go to stderr.

    Returns:
        0, `ERROR_EXIT` for a bad path, format or file, or (`validate`)
        `VALIDATION_FAILED_EXIT` where a row or shard is bad.
    """
    stream = out or sys.stdout

    def body() -> int:
        from zephon_torch._validate import open_each
        from zephon_torch._validate import validate as read_all

        def read_every_row(datasets: list[Dataset], unopened: list[DataError]) -> int:
            return read_all(
                datasets,
                text_field=text_field,
                token_field=token_field,
                chat_field=chat_field,
                vocab_size=vocab_size,
                unopened=unopened,
                shown=show_errors,
                out=stream,
            )

        try:
            dataset = _open(path, format_, index_cache_dir, storage_options, columns)
        except DataError as error:  # a damaged file: --validate goes on with the others
            if not validate:
                raise
            datasets, unopened = open_each(
                path,
                error,
                name=_dataset_name(path),
                format_=format_,
                index_cache_dir=index_cache_dir,
                columns=columns,
                storage_options=storage_options,
            )
            if datasets or unopened != [error]:
                print(
                    f"{path} does not open as a whole; --validate opens its "
                    f"{len(datasets) + len(unopened):,} files one by one",
                    file=stream,
                )
            else:  # its index is damaged: no file of it reads without
                print(f"{path} does not open: its index does not read", file=stream)
            return read_every_row(datasets, unopened)
        try:
            _inspect(dataset, path, rows, stream)
        except DataError as error:  # a bad first row: --validate reports it with the rest
            if not validate:
                raise
            print(f"{path}: no preview, its first rows do not read ({error})", file=stream)
        return read_every_row([dataset], []) if validate else 0

    return _guarded("inspect", body, stream)


def run_index(
    path: str,
    *,
    format_: str | None = None,
    index_cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
    columns: list[str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Builds the line index of every JSONL shard at `path` (cached; stale ones are rebuilt), and
    for remote Parquet and Vortex remembers the row counts; `storage_options` as for
    `run_inspect`, and `columns`.

    Prints the shards indexed (and how many were already cached), the rows and the time; for a
    format without line indexes it says so. Returns 0, or `ERROR_EXIT` for a bad path or when an
    index or row count could not be written to the index cache.
    """
    stream = out or sys.stdout
    return _guarded(
        "index",
        lambda: _index(path, format_, index_cache_dir, storage_options, columns, stream),
        stream,
    )


def _guarded(command: str, body: Callable[[], int | None], out: TextIO) -> int:
    try:
        return body() or 0
    except BrokenPipeError:  # the output's reader has gone: the command line ends quietly
        raise
    except (ZephonError, ImportError, OSError) as error:
        return failed(command, error, out)


def failed(command: str, error: BaseException, out: TextIO) -> int:
    """Report `error` of `command` in one line on stderr (after what `out` holds); returns
    `ERROR_EXIT`."""
    out.flush()
    message = " ".join(str(error).split())
    print(f"zephon-torch {command}: error: {message}", file=sys.stderr)
    return ERROR_EXIT


def _open(
    path: str,
    format_: str | None,
    index_cache_dir: str | None,
    storage: dict[str, Any] | None,
    columns: list[str] | None,
) -> Dataset:
    return Dataset.from_path(
        _dataset_name(path),
        path,
        format=format_,
        index_cache_dir=index_cache_dir,
        storage_options=storage,
        columns=columns,
    )


def _dataset_name(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path or "dataset"


def _inspect(dataset: Dataset, path: str, rows: int, out: TextIO) -> None:
    try:
        sample = dataset.read_rows(0, list(range(min(max(rows, 1), dataset.shards[0].num_rows))))
    except DataError as error:
        name_line(error, [dataset])  # its line in a JSONL file, as a run's error says it
        raise
    print(f"path:    {path}", file=out)
    print(f"format:  {dataset.format}", file=out)
    print(f"shards:  {len(dataset.shards):,}", file=out)
    print(f"rows:    {dataset.num_rows:,}", file=out)
    split = [shard for shard in dataset.shards if shard.blocks]
    if split:
        blocks = sum(len(shard.blocks) for shard in split)
        size = f"{parquet.WINDOW_BLOCK_BYTES / (1 << 20):g}"
        print(
            f"windows: {len(split):,} of {len(dataset.shards):,} shards split into {blocks:,} "
            f"blocks of row groups (up to {size} MiB each), which shuffle windows count as shards",
            file=out,
        )
    first = "row" if len(sample) == 1 else f"{len(sample)} rows"
    print(f"fields (types from the first {first}):", file=out)
    for name, kinds in field_types(sample).items():
        print(f"  {name}: {kinds}", file=out)
    print("rows per shard:", file=out)
    for shard in dataset.shards[:_SHARDS_LISTED]:
        print(f"  {shard.num_rows:>12,}  {shard.path}", file=out)
    hidden = len(dataset.shards) - _SHARDS_LISTED
    if hidden > 0:
        rest = sum(shard.num_rows for shard in dataset.shards[_SHARDS_LISTED:])
        print(f"  ... and {hidden:,} more shards with {rest:,} rows", file=out)
    shown = sample[: max(rows, 0)]
    if shown:
        print(f"first {len(shown)} rows:", file=out)
    for number, row in enumerate(shown):
        print(f"  [{number}]", file=out)
        for name, value in row.items():
            print(f"    {name}: {preview(value)}", file=out)


def _index(
    path: str,
    format_: str | None,
    index_cache_dir: str | None,
    storage: dict[str, Any] | None,
    columns: list[str] | None,
    out: TextIO,
) -> None:
    from zephon_torch.io._line_index import default_cache_dir

    cache = os.path.abspath(os.path.expanduser(index_cache_dir or default_cache_dir()))
    before = _cached_shards(path, format_, cache)
    started = time.perf_counter()
    dataset = _open(path, format_, cache, storage, columns)
    seconds = time.perf_counter() - started
    if dataset.remote and dataset.format in SCHEMA_FORMATS:  # counts kept with the columns
        _require_remembered(path, dataset, cache)
        print(
            f"remembered the row counts of {_shards_of(dataset)} "
            f"({dataset.num_rows:,} rows) in {seconds:.2f} s; index cache {cache}: later opens "
            "read only the listing",
            file=out,
        )
        return
    if dataset.format != _INDEXED:
        print(
            f"format {dataset.format!r} needs no index: row counts come from its footers, "
            f"headers or index.json ({_shards_of(dataset)}, {dataset.num_rows:,} rows)",
            file=out,
        )
        return
    _require_written(path, format_, cache, dataset)
    if dataset.remote:
        _require_remembered(path, dataset, cache)
    count = len(dataset.shards)
    if before == count:
        done = f"{_shards_of(dataset)} {'was' if count == 1 else 'were'} indexed already (no scan)"
    elif before:
        done = f"indexed {count - before:,} of {_shards_of(dataset)} ({before:,} were already)"
    else:
        done = f"indexed {_shards_of(dataset)}"
    rows = counted(dataset.num_rows, "row")
    print(f"{done}: {rows} in {seconds:.2f} s; index cache {cache}", file=out)


def _require_written(path: str, format_: str | None, cache: str, dataset: Dataset) -> None:
    """Raises a `StorageError` unless every shard's line index is in `cache`: the open only
    warns when it cannot write one, and `index` exists to write them.

    Local shards are counted; for remote ones (indexed through downloaded copies) the cache
    folder must at least be writable."""
    cached = _cached_shards(path, format_, cache)
    if cached is not None and cached < len(dataset.shards):
        missing = len(dataset.shards) - cached
        raise StorageError(
            f"the line indexes of {missing:,} of {len(dataset.shards):,} shards could not be "
            f"written to the index cache {cache}; {_WRITABLE}"
        )
    if cached is None and not _writable(cache):
        raise StorageError(f"the index cache {cache} cannot be written; {_WRITABLE}")


def _require_remembered(path: str, dataset: Dataset, cache: str) -> None:
    """Raises a `StorageError` unless the row count of every remote shard is remembered in
    `cache`: the open skips a folder it cannot write, and counts objects listed without a
    version at every open, keeping them nowhere."""
    missing = dataset.unremembered_shards(cache)
    if missing is None:
        raise StorageError(
            f"the storage lists the objects of {path} without a version (ETag or modification "
            "time), so a rewrite could not be told from the copy counted: their row counts "
            "cannot be remembered, and every open counts them again"
        )
    if missing:
        raise StorageError(
            f"the row counts of {len(missing):,} of {len(dataset.shards):,} shards (e.g. "
            f"{missing[0]}) could not be written to the index cache {cache}; {_WRITABLE}"
        )


def _writable(folder: str) -> bool:
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _shards_of(dataset: Dataset) -> str:
    """How many shards `dataset` has, in words: "1 shard", "12 shards"."""
    return counted(len(dataset.shards), "shard")


def _cached_shards(path: str, format_: str | None, cache: str) -> int | None:
    """How many local JSONL shards at `path` have a current cached index; None if not known.

    Index files are named by each file's (path, size, mtime), so a changed file has none and is
    scanned again. Remote and `hf://` shards are indexed through their downloaded copies, which
    are not known before the open.
    """
    from zephon_torch.io._discover import find_files
    from zephon_torch.io._line_index import cache_file
    from zephon_torch.io._remote import is_remote

    if is_remote(path) or path.startswith("hf://"):
        return None
    detected, files = find_files(path, format_=format_, exclude=cache)
    if detected != _INDEXED:
        return None
    return sum(os.path.exists(cache_file(cache, file)) for file in files)


def field_types(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Each field's type names over `rows`, in first-seen order, joined by " | "."""
    kinds: dict[str, list[str]] = {}
    for row in rows:
        for name, value in row.items():
            seen = kinds.setdefault(name, [])
            kind = type_name(value)
            if kind not in seen:
                seen.append(kind)
    return {name: " | ".join(seen) for name, seen in kinds.items()}


def type_name(value: object, depth: int = 0) -> str:
    """A short type guess: `int`, `str`, `list[int]`, `ndarray[int32, 1-D]`, `dict`, ...; lists
    nested deeper than `_MAX_DEPTH` read `list[...]` (no recursion as deep as the value)."""
    if value is None:
        return "null"
    if isinstance(value, np.ndarray):
        return f"ndarray[{value.dtype}, {value.ndim}-D]"
    if isinstance(value, np.generic):
        return str(value.dtype)
    if isinstance(value, list | tuple):
        if depth == _MAX_DEPTH and value:
            return "list[...]"
        inner = sorted({type_name(item, depth + 1) for item in value[:_MAX_ITEMS]})
        return f"list[{' | '.join(inner)}]" if inner else "list"
    return type(value).__name__


def preview(value: object) -> str:
    """One line for a value: strings cut at ~200 chars, arrays and long lists summarised."""
    if isinstance(value, np.ndarray):
        head = ", ".join(str(item) for item in value.reshape(-1)[:_MAX_ITEMS].tolist())
        more = ", ..." if value.size > _MAX_ITEMS else ""
        return f"{value.dtype} shape={list(value.shape)} [{head}{more}]"
    if isinstance(value, list | tuple) and len(value) > _MAX_ITEMS:
        head = ", ".join(_cut(repr(item)) for item in value[:_MAX_ITEMS])
        return f"list of {len(value):,} [{head}, ...]"
    if isinstance(value, str):
        return _cut(repr(value), extra=f" ({len(value):,} chars)")
    if isinstance(value, bytes):
        return _cut(repr(value), extra=f" ({len(value):,} bytes)")
    return _cut(repr(value))


def _cut(text: str, *, extra: str = "") -> str:
    if len(text) <= _MAX_CHARS:
        return text
    return f"{text[:_MAX_CHARS]}...{extra}"
