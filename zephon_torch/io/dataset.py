"""`Dataset`: a named, ordered list of shards with known row counts, read row by row on demand.

Opening a dataset reads metadata only (see `_opening`). Everything downstream (pointer
streams, state fingerprints) needs only the shard list; rows are read later, by
`(shard, row)`, from many threads at once.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zephon_torch.errors import ConfigError, DataError, positive_setting
from zephon_torch.io._io_options import IoOptions
from zephon_torch.io._line_index import default_cache_dir
from zephon_torch.io._opening import naming, open_path
from zephon_torch.io._projection import Projection
from zephon_torch.io._reader_settings import narrowed, with_io_options
from zephon_torch.io._remote_reader import RemoteReader
from zephon_torch.io._rows import Rows, TokenIds, as_row_array, check_in_range, where_in_file
from zephon_torch.io._shards import Shard, fingerprint_of
from zephon_torch.io.formats import ShardReader, token_reader
from zephon_torch.io.memory import MemoryReader, rows_of

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

NO_ROWS = "has no rows; remove it or narrow the path"  # a shard's error: a file without rows


class Dataset:
    """A named, ordered list of shards with their row counts; reads rows on demand.

    Build one with `from_path` or `from_dict`. It is safe to call `read_rows` from many threads
    at once, and a dataset pickles without its open files and caches (DataLoader workers reopen
    them on first use), so sending one to a worker process costs its shard list only, except
    for in-memory datasets, whose rows travel with them.

    Args:
        name: a non-empty name, used in mixtures, states and error messages.
        format: one of `formats.FILE_FORMATS`, or "memory".
        shards: the shards, in order; each must have rows.
        reader: reads the shards' rows (see `zephon_torch.io.formats.ShardReader`).
        revision: the hub commit an `hf://` dataset was read at (in the fingerprint).

    Raises:
        ConfigError: for an empty or non-str name or no shards.
        DataError: for a shard without rows, naming the dataset and the shard.
    """

    def __init__(
        self,
        *,
        name: str,
        format: str,  # noqa: A002 - the public contract's name
        shards: Sequence[Shard],
        reader: ShardReader,
        revision: str | None = None,
    ) -> None:
        _check_name(name)
        if not shards:
            raise ConfigError(f"`shards` must not be empty for dataset {name!r}")
        for shard in shards:
            if shard.num_rows <= 0:
                # a JSONL file is empty (or blank); any other format's may be complete
                empty = " (an empty file, or of blank lines only)" if format == "jsonl" else ""
                raise DataError(
                    f"has no rows{empty}; remove it or narrow the path" if empty else NO_ROWS,
                    dataset=name,
                    shard=shard.path,
                )
        self.name = name
        self.format = format
        self.shards = tuple(shards)
        self._reader = reader
        self._num_rows = sum(shard.num_rows for shard in self.shards)
        self.revision = revision  # the hub commit an hf:// dataset was read at

    @property
    def num_rows(self) -> int:
        """The total number of rows over all shards."""
        return self._num_rows

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The columns its rows keep (`from_path(columns=...)`); None: every column."""
        projection = getattr(self._reader, "projection", None)
        return None if projection is None else projection.columns

    @property
    def token_columns(self) -> tuple[str, ...]:
        """The columns read as token ids (`from_path(token_columns=...)`)."""
        projection = getattr(self._reader, "projection", None)
        return () if projection is None else projection.token_columns

    @classmethod
    def from_path(
        cls,
        name: str,
        path: str | os.PathLike[str],
        *,
        format: str | None = None,  # noqa: A002 - the public contract's name
        columns: Sequence[str] | None = None,
        token_columns: Sequence[str] | None = None,
        index_cache_dir: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        io_options: Mapping[str, Any] | IoOptions | None = None,
    ) -> Dataset:
        """Opens the files at a local path or URL as one dataset, one shard per file.

        Remote URLs (`s3://`, `gs://`, `az://`, `memory://`, any fsspec protocol) are listed once,
        in every format; each shard (with its `.npy` offsets file, and an MDS or LitData dataset's
        `index.json`) is downloaded whole into the node-local shard cache when first read (or ahead
        of use: `io_options={"cache": {"prefetch_bytes"}}`) and then read like a local file. Objects
        are keyed by URL, size and etag/mtime, so a changed object is downloaded again. Opening
        reads row counts from `index.json`, Parquet footers or `.npy` headers; a remote JSONL or
        Vortex shard is downloaded once to be counted, and its count is kept in `index_cache_dir` so
        later opens download nothing (`zephon-torch index URL` does this ahead of a job).
        `hf://org/name[/config]/split` reads a Hugging Face dataset's data files: online, listed on
        the hub and read like any remote URL, at the commit the revision pointed at when opened
        (`storage_options` go to `huggingface_hub`'s `HfFileSystem`, e.g. `token`); offline
        (`HF_HUB_OFFLINE=1`) or when no answer comes from the hub, from the local hub cache.

        Args:
            name: the dataset name.
            path: a file, a directory (every data file inside, recursively, sorted by path;
                names starting with "." or "_" are skipped; linked folders are read, each
                folder once) or a glob (`**` crosses folders).
            format: one of `formats.FILE_FORMATS`: "jsonl", "litdata", "mds", "npy",
                "parquet", "vortex". None detects it: a directory holding an `index.json` is an
                MDS or LitData dataset (one shard per shard or chunk file it lists), told apart
                by the index; files by the endings `.jsonl`, `.ndjson`, `.json` (each also with
                `.gz`, `.gzip`, `.zst` or `.zstd`), `.parquet`, `.pq`, `.parq`, `.vortex` and
                `.npy`. Given for a directory, every file in it is read as that format,
                whatever its name, but for notes beside the data (`README.md`, `LICENSE`).
            columns: the columns rows keep, in this order; None keeps all. Parquet, Vortex,
                MDS and LitData then read and decode nothing else; JSONL rows are filtered
                after parsing. A shard without such a column raises DataError.
            token_columns: columns of token ids, each returned as a 1-D numpy integer array
                (a read-only view where the format allows) rather than a list of ints: Parquet
                and Vortex list columns, JSONL lists. MDS `ndarray`, LitData array, LitData
                `TokensLoader` ("input_ids") and `.npy` ("input_ids") columns are arrays anyway.
            index_cache_dir: where JSONL line indexes are cached; defaults to
                `$ZEPHON_TORCH_CACHE/index`, else `~/.cache/zephon_torch/index`.
            storage_options: passed to the fsspec file system of a remote URL (credentials,
                `client_kwargs={"endpoint_url": ...}`, ...).
            io_options: `{"cache": {"dir", "max_bytes", "prefetch_bytes",
                "prefetch_threads"}, "retry": {"attempts", "initial_delay", "max_delay",
                "timeout", "min_rate", "rate_window"}, "parquet": {"row_group_cache_bytes"},
                "mds": {"verify_hashes"}}`
                (see `CacheOptions`, `RetryPolicy`, `ParquetOptions`, `MdsOptions`); unknown
                keys are refused. Remote URLs use `cache` and `retry`; `parquet` and `mds`
                apply to local datasets too, and `cache` to local compressed JSONL
                (decompressed into it).

        Returns:
            The dataset, with row counts read from Parquet and Vortex footers, `.npy` headers
            (remote: without downloading the tokens), MDS and LitData `index.json` files, and
            JSONL line indexes.

        Raises:
            ConfigError: for a bad name, a path naming no files, an unknown format, a
                directory mixing formats, or bad `columns`/`token_columns`.
            DataError: for a file that is not of its format or has no rows (Parquet,
                Vortex and `.npy` files without rows are left out with a warning, unless all
                are), a shard file that `index.json` lists and the folder or bucket lacks, or a
                shard lacking a requested column.
            ImportError: for .zst files when `zstandard` is not installed, or a URL whose
                fsspec or huggingface_hub package is missing.
            StorageError: when remote storage fails after the retries, naming the URL.
        """
        _check_name(name)
        projection = Projection.of(columns, token_columns)
        options = IoOptions.of(io_options)
        cache_dir = os.path.abspath(os.path.expanduser(index_cache_dir or default_cache_dir()))
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(
                f"`path` of dataset {name!r} must be one file, folder, glob or URL (a str or "
                f"path), got a {type(path).__name__}: for several files, pass their folder or "
                "a glob that names them (such as 'data/train-*.jsonl')"
            )
        with naming(name):
            opened = open_path(
                name, os.fspath(path), format, projection, cache_dir, storage_options or {}, options
            )
        shards = [
            Shard(path=file, num_rows=rows, blocks=blocks) for file, rows, blocks in opened.files
        ]
        return cls(
            name=name,
            format=opened.format,
            shards=shards,
            reader=opened.reader,
            revision=opened.revision,
        )

    @classmethod
    def from_dict(
        cls,
        name: str,
        data: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
        *,
        shard_size: int | None = None,
    ) -> Dataset:
        """Builds an in-memory dataset from columns or rows.

        Args:
            name: the dataset name.
            data: a mapping of equally long columns (sequences or arrays) or a sequence of
                row mappings. It is copied.
            shard_size: rows per shard (the last shard may be shorter); None makes one shard.

        Returns:
            A dataset of format "memory" with shards `memory://<name>/<i>`.

        Raises:
            ConfigError: for a bad name, a bad `shard_size`, or badly shaped `data`.
            DataError: when `data` has no rows.
        """
        _check_name(name)
        if shard_size is not None:
            shard_size = positive_setting(shard_size, "`shard_size`", what="a positive int or None")
        rows = rows_of(data)
        if not rows:
            raise DataError("has no rows: `data` is empty", dataset=name)
        size = shard_size or len(rows)
        tables = {
            f"memory://{name}/{number}": rows[start : start + size]
            for number, start in enumerate(range(0, len(rows), size))
        }
        shards = [Shard(path=path, num_rows=len(table)) for path, table in tables.items()]
        reader = MemoryReader(dataset=name, shards=tables)
        return cls(name=name, format="memory", shards=shards, reader=reader)

    def read_rows(self, shard: int, rows: Rows) -> list[dict[str, Any]]:
        """Reads rows of one shard; thread-safe.

        Args:
            shard: the shard's position in `shards`.
            rows: row numbers within the shard, in any order, repeats allowed (a sequence of
                ints or an integer numpy array).

        Returns:
            One new dict per requested row, in the order asked. Nested values may be shared
            with a cache: do not mutate them.

        Raises:
            DataError: for a shard or row out of range, or a row that does not decode, naming
                the dataset, the shard and the row.
            TypeError: when `rows` holds anything but integers.
        """
        path, positions = self._checked_rows(shard, rows)
        return self._reader.read(path, positions)

    def read_tokens(self, shard: int, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """As `read_rows`, each row's `field` alone, where the format stores it as token ids
        (`.npy`, MDS and LitData arrays): a sequence of 1-D integer arrays, views of the stored
        ids (the built-in readers give a `TokenSpans`, which makes each view when it is asked
        for). None where it does not (then read the rows)."""
        reader = token_reader(self._reader)
        if reader is None:
            return None
        return reader.read_tokens(*self._checked_rows(shard, rows), field)

    def maps_token_ids(self) -> bool:
        """Whether `read_tokens` gives views of mapped files for every shard (`.npy` files,
        uncompressed MDS and LitData shards, on local disk): a reader may then hold as many as
        it likes, where views of decoded shards keep those shards in memory. False for the
        other formats (rows are decoded), compressed shards and remote data (maps of cached
        copies, whose disk space an eviction frees only once no view of them is held)."""
        reader = token_reader(self._reader)
        return reader is not None and reader.maps_token_ids()

    def line_of(self, path: str, row: int) -> str | None:
        """Where row `row` of the shard at `path` (as errors name it) lies in its file, for a
        message to say: "line 37 of the file" for JSONL (rows count its non-blank lines from
        0); None for the other formats, whose row numbers say it, and where the file cannot
        be looked at now (a remote copy that cannot be opened, a shard of no dataset's). Never
        raises: the message it adds to is what the user must get."""
        try:
            return where_in_file(self._reader, path, row)
        except Exception:
            return None

    def _checked_rows(self, shard: int, rows: Rows) -> tuple[str, npt.NDArray[np.int64]]:
        """The shard's path and `rows` as an array, each checked to lie in the shard."""
        entry = self._shard(shard)
        positions = as_row_array(rows)
        check_in_range(positions, entry.num_rows, dataset=self.name, shard=entry.path)
        return entry.path, positions

    @property
    def remote(self) -> bool:
        """Whether shards are downloaded through the node-local cache (so prefetch helps)."""
        return isinstance(self._reader, RemoteReader)

    def cache_counters(self) -> dict[str, int] | None:
        """This process's shard-cache hits, misses and bytes downloaded (None: not remote)."""
        return self._reader.cache_counters() if isinstance(self._reader, RemoteReader) else None

    def unremembered_shards(self, index_cache_dir: str) -> list[str] | None:
        """Remote shards whose row counts `index_cache_dir` does not remember ([] for a local
        dataset; None where none can be: objects listed without a version)."""
        if not isinstance(self._reader, RemoteReader):
            return []
        return self._reader.unremembered(index_cache_dir)

    def with_io_options(self, io_options: Mapping[str, Any] | IoOptions) -> Dataset:
        """This dataset read with other shard-cache, retry, Parquet and MDS settings.

        The keys of an `io_options` mapping (as for `from_path`) replace the dataset's own;
        the rest are kept. An `IoOptions` replaces them all. A local dataset takes only the
        `parquet` settings (a Parquet one: a new reader, its caches empty), the `mds` ones (an
        MDS one: likewise) and, for JSONL, the `cache` settings (where compressed shards are
        decompressed); in-memory and other local datasets are returned as they are.

        Raises:
            ConfigError: for unknown keys or bad values.
        """
        reader = with_io_options(self._reader, self.format, io_options)
        return self if reader is self._reader else self._reading_with(reader)

    def reading(self, fields: Sequence[str], token_field: str | None = None) -> Dataset:
        """This dataset reading only ``fields``, ``token_field`` (one of them) as a token
        column: the same rows in the same order, less decoded. Where the format skips unread
        columns (Parquet, Vortex, MDS, LitData; local or remote) and `from_path` was given no
        `columns=`; a token column where Parquet and Vortex lists give one numpy array a row
        rather than a Python int an id (`token_columns=`). Otherwise the dataset itself.

        The pipeline calls it for recipes whose every field read is known (no `map` or
        `filter`). A shard without one of ``fields``, or whose ``token_field`` is no list of
        integers, is then a `DataError` naming the shard and its columns when opened, not one
        for each of its rows.
        """
        reader = narrowed(self._reader, self.format, fields, token_field)
        return self if reader is self._reader else self._reading_with(reader)

    def _reading_with(self, reader: ShardReader) -> Dataset:
        """This dataset read through another reader."""
        return Dataset(
            name=self.name,
            format=self.format,
            shards=self.shards,
            reader=reader,
            revision=self.revision,
        )

    def prefetch(self, shards: Iterable[int], *, share: int = 1) -> None:
        """Starts downloading upcoming shards into the node-local cache; returns at once.

        Give the shards the pointer streams read from now on, in order, the current one
        first. Background threads download them as far ahead as the cache's `prefetch_bytes`
        reaches (shards already cached count toward it and are skipped), so a later
        `read_rows` finds them cached; `shards` is consumed only that far. `share` is the
        number of remote datasets read together (a mixture): each gets that part of the
        budget. A no-op for local and in-memory datasets. Errors surface at the read.

        Raises:
            DataError: for a shard number out of range (remote datasets).
        """
        if isinstance(self._reader, RemoteReader):
            downloads = self._reader.downloads
            downloads.prefetch((self._shard(shard).path for shard in shards), share=share)

    def check_window(self, shards: Iterable[int], *, share: int = 1) -> None:
        """Warns once when a shuffle window's `shards` (read all at once) do not fit in this
        dataset's part of the shard cache (`share`: the remote datasets read together): each
        is then evicted and downloaded again while its rows are read. Compressed JSONL counts
        at its stored size, though its decompressed copy goes into the cache too. A no-op for
        local and in-memory datasets."""
        if isinstance(self._reader, RemoteReader):
            paths = [self._shard(shard).path for shard in shards]
            self._reader.downloads.check_window(paths, share=share)

    def fingerprint(self) -> dict[str, Any]:
        """Returns a JSON-able summary that changes when the shard list or a row count does.

        `rows_digest` is the first 16 hex digits of a sha256 over each shard's path below
        the deepest folder holding every shard (its file name where they lie in one folder)
        and row count, in order: a changed dataset is noticed without reading data, while
        moving the files to another folder or machine keeps the fingerprint. Where
        shards are split into window blocks (see `Shard.blocks`), which set the order,
        `blocks_digest` covers them likewise. An `hf://` dataset adds the hub commit it was
        read at (`revision`): pin it with `hf://org/name@REVISION/...` to resume on it.
        """
        return fingerprint_of(self.name, self.format, self.shards, self.revision)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, format={self.format!r}, shards={len(self.shards)}, "
            f"rows={self.num_rows})"
        )

    def _shard(self, shard: int) -> Shard:
        number = operator.index(shard)
        if not 0 <= number < len(self.shards):
            raise DataError(
                f"shard {number} is out of range: the dataset has {len(self.shards)} shards",
                dataset=self.name,
            )
        return self.shards[number]


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"`name` must be a non-empty str, got {name!r}")
