"""Random access to rows of JSON Lines shards: plain, gzip or zstd.

Each shard has a line index (`_line_index`): built by one scan, cached on disk, memory-mapped.
A plain shard's lines are read with `os.pread` from a descriptor kept open, so reading row i is
one read and one JSON decode (rows that lie close together, one read). Not a slice of a memory
map: a file cut short in place while it is read (a `cp` over it) would fault the process with
SIGBUS, where a short read is a `DataError`. A compressed shard cannot be sliced in place: it
is decompressed once per node, streaming, into the node-local shard cache
(`ShardCache.open_made`: bounded by its `max_bytes`, LRU, shared by the node's processes), and
mapped from there, so its bytes live once in the page cache, not in every process that reads
it. Rows are numbered by non-blank line, from 0.
Measured on one core, 650-byte rows in chunks of 64: plain shards 0.6 M rows/s in order and
0.37 M at random (one read each; slices of a map gave 0.56 M, the read costs about 0.7 us a
row, against tens of microseconds to tokenize it), decompressed ones about 0.5 M at random;
more threads add no throughput (the GIL).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from zephon_torch.errors import ConfigError, DataError, StorageError
from zephon_torch.io._cache import LruCache
from zephon_torch.io._cache_folder import CacheFolderError
from zephon_torch.io._compression import (
    Compression,
    CorruptError,
    ForeignError,
    TooLargeError,
    compression_of,
    decompress_bytes,
    decompress_to,
)
from zephon_torch.io._io_options import CacheOptions
from zephon_torch.io._json_line import one_document, parse, preview
from zephon_torch.io._line_index import LineIndex, load_or_build
from zephon_torch.io._mapped import check_whole, map_file
from zephon_torch.io._pread import Descriptor, identity, read_spans
from zephon_torch.io._remote_sizing import disk_size
from zephon_torch.io._rows import CHANGED_NOTE, Rows, as_row_array, check_in_range
from zephon_torch.io._shard_cache import ShardCache

_JSON_TYPE_NAMES = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_log = logging.getLogger(__name__)
_COUNT_PIECE = 1 << 22  # bytes read at a time to count lines


class JsonlReader:
    """Reads the JSONL shards of one dataset; thread-safe, and picklable without its caches.

    Args:
        dataset: the dataset name, used in error messages.
        index_cache_dir: where line indexes are cached (see `_line_index`).
        max_open: how many plain shards (descriptors) and line indexes to keep open.
        max_decompressed: how many decompressed shards to keep mapped, at most an eighth of the
            cache's `max_bytes` (or of its disk, where smaller) of them (an evicted one's disk
            space is freed when no process maps it any more).
        cache: the shard cache decompressed shards go to; None: the default one.
    """

    def __init__(
        self,
        *,
        dataset: str,
        index_cache_dir: str,
        max_open: int = 32,
        max_decompressed: int = 4,
        cache: CacheOptions | None = None,
    ) -> None:
        self.dataset = dataset
        self.index_cache_dir = index_cache_dir
        self.max_open = max_open
        self.max_decompressed = max_decompressed
        self.cache = cache or CacheOptions()
        self._open_caches()

    def _open_caches(self) -> None:
        self._indexes: LruCache[LineIndex] = LruCache(self.max_open)
        # each local shard's size, inode and mtime when first indexed here (a few ints a
        # shard, never evicted: a shard read again after both its LRU entries went must still
        # be the file first indexed; a compressed one's file too, as its index and decompressed
        # copy leave their LRUs apart; downloads and decompressed files are never rewritten)
        self._identities: dict[str, tuple[int, int, int]] = {}
        self._files: LruCache[Descriptor] = LruCache(self.max_open)  # plain shards, read by pread
        # mapped files of evicted shards hold their disk space until unmapped: an eighth of
        # the cache (or of its disk, where smaller) at most, as remote readers keep open
        room = min(self.cache.max_bytes, disk_size(self.cache.directory))
        self._decompressed: LruCache[mmap.mmap | bytes] = LruCache(
            self.max_decompressed, max_weight=max(1, room // 8), weigh=len
        )
        self._compression: dict[str, Compression | None] = {}
        self._shard_cache: tuple[int, ShardCache] | None = None  # (pid, cache)

    def __getstate__(self) -> dict[str, Any]:
        """Settings and the shards' identities (a copy, a spawned DataLoader worker or process
        runner, checks its reads against the files this reader first read); no caches."""
        return {
            "dataset": self.dataset,
            "index_cache_dir": self.index_cache_dir,
            "max_open": self.max_open,
            "max_decompressed": self.max_decompressed,
            "cache": self.cache,
            "identities": dict(self._identities),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = {"cache": CacheOptions(), **state}
        identities = state.pop("identities", {})
        self.__dict__.update(state)
        self._open_caches()
        self._identities.update(identities)

    def with_cache(self, cache: CacheOptions) -> JsonlReader:
        """This reader decompressing into another shard cache; its caches empty, the shards'
        identities kept."""
        reader = JsonlReader.__new__(JsonlReader)
        reader.__setstate__({**self.__getstate__(), "cache": cache})
        return reader

    def num_rows(self, path: str) -> int:
        """Returns the number of non-blank lines of the shard, from its (cached) line index."""
        try:
            return int(self._index(path).shape[1])
        except FileNotFoundError:
            raise self._missing(path) from None

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the given rows of the shard, decoded, in the order asked.

        Args:
            path: the shard.
            rows: row numbers within the shard, any order, repeats allowed.

        Returns:
            One new dict per requested row.

        Raises:
            DataError: for a malformed line, a line that is not a JSON object, a row past the
                end of the shard, a compressed shard that does not decompress, or a shard file
                that is gone.
        """
        try:
            index = self._index(path)
            lines = self._lines(path)
        except FileNotFoundError:
            raise self._missing(path) from None
        positions = as_row_array(rows)
        count = int(index.shape[1])
        check_in_range(positions, count, dataset=self.dataset, shard=path, note=CHANGED_NOTE)
        starts = index[0, positions].tolist()
        ends = index[1, positions].tolist()
        decoded: list[dict[str, Any]] = []
        spans = zip(positions.tolist(), starts, ends, lines(starts, ends), strict=True)
        for row, start, end, line in spans:
            if line is None:
                raise DataError(
                    f"the shard file was cut short: it ends before the line at byte {start}"
                    f"{CHANGED_NOTE}",
                    dataset=self.dataset,
                    shard=path,
                    row=row,
                    shard_wide=True,
                )
            try:
                value = parse(line)
            except (ValueError, RecursionError) as error:  # also UnicodeDecodeError; too deep
                cut = row == count - 1 and self._unterminated(path, end)
                raise DataError(
                    f"malformed JSON in the line at byte {start}: {error} "
                    f"(line starts {preview(line)!r}){one_document(line)}"
                    f"{_CUT_NOTE if cut else ''}",
                    dataset=self.dataset,
                    shard=path,
                    row=row,
                ) from error
            if type(value) is not dict:
                kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
                many = type(value) is list and any(type(item) is dict for item in value)
                hint = (
                    "; the file looks like one JSON array of objects, not JSON Lines (one "
                    "object per line): convert it, or leave it out of the dataset"
                    if many
                    else ""
                )
                raise DataError(
                    f"expected a JSON object per line, got a JSON {kind} "
                    f"in the line at byte {start}{hint}",
                    dataset=self.dataset,
                    shard=path,
                    row=row,
                )
            decoded.append(value)
        return decoded

    def line_of(self, path: str, row: int) -> str | None:
        """Where row ``row`` of the shard lies in its file, for an error to name: "line 37 of
        the file" (rows count non-blank lines from 0, so row 30 is line 31 only in a file
        without blank lines); None where that cannot be told (a row past the end, a file gone).
        Counts the newlines before the row: one scan, for errors only."""
        newlines: int | None
        try:
            start = int(self._index(path)[0, row])
            compressed = self._compression_of(path) is not None
            if compressed:  # a file of ours, never cut: counted in its map, piece by piece
                buffer = self._buffer(path)
                pieces = (
                    buffer[a : min(a + _COUNT_PIECE, start)] for a in range(0, start, _COUNT_PIECE)
                )
                newlines = sum(piece.count(b"\n") for piece in pieces)
            else:  # read, not mapped: a file cut short meanwhile must not fault the process
                newlines = _newlines_before(path, start)
        except (OSError, IndexError, ValueError, DataError, ConfigError):
            return None
        if newlines is None:
            return None
        return f"line {newlines + 1} of the file{' once decompressed' if compressed else ''}"

    def _unterminated(self, path: str, end: int) -> bool:
        """Whether the shard's bytes end at ``end`` with no newline after its last line (which
        failed to parse): a file cut short, as a copy or a write stopped midway leaves it.
        For errors only."""
        try:
            if self._compression_of(path) is not None:
                return len(self._buffer(path)) == end
            return os.path.getsize(path) == end
        except (OSError, DataError, ConfigError):
            return False

    def _missing(self, path: str) -> DataError:
        return DataError(
            f"the shard file is missing{CHANGED_NOTE}", dataset=self.dataset, shard=path
        )

    def _index(self, path: str) -> LineIndex:
        return self._indexes.get_or_load(path, partial(self._load_index, path))

    def _load_index(self, path: str) -> LineIndex:
        download = self._download(path)
        if download is None:
            # before the scan: a change during it is seen at the reads (a compressed shard's
            # as it is decompressed again)
            self._check_identity(path, identity(os.stat(path)))
        return load_or_build(path, self.index_cache_dir, lambda: self._whole(path), name=download)

    def _check_identity(self, path: str, now: tuple[int, int, int]) -> None:
        """``DataError`` when the local shard at ``path`` is not the file first indexed here
        (``now``: its size, inode and mtime): rewritten in place, appended to or replaced, its
        lines lie elsewhere, and its rows are not those the dataset was opened with."""
        first = self._identities.setdefault(path, now)
        if now == first:
            return
        if now[1] != first[1]:
            how = "replaced by another file"
        elif now[0] != first[0]:
            how = f"rewritten or appended to ({first[0]} bytes, now {now[0]})"
        else:
            how = "rewritten (its modification time moved)"
        raise DataError(
            f"the shard file was {how} since it was first read here: open the dataset again"
            f"{CHANGED_NOTE}",
            dataset=self.dataset,
            shard=path,
        )

    def _whole(self, path: str) -> mmap.mmap | bytes:
        """The shard's buffer, checked against its file before the line index scans it: its
        map may be older than the index (the two caches evict apart)."""
        buffer = self._buffer(path)
        check_whole(buffer, dataset=self.dataset, shard=path)
        return buffer

    def _download(self, path: str) -> str | None:
        """The shard cache's name of `path` when it is a download there (the name says which
        object and version it holds, while its mtime moves with the cache's LRU clock)."""
        source = os.path.abspath(path)
        return os.path.basename(source) if os.path.dirname(source) == self.cache.directory else None

    def _lines(self, path: str) -> Callable[[list[int], list[int]], list[bytes | None]]:
        """Gives the lines at byte spans ``(starts[i], ends[i])`` of the shard, in order; None
        for one the file no longer holds whole (cut short since it was indexed).

        Raises:
            DataError: when the plain file open here is not the one first indexed
                (``_check_identity``; one ``fstat`` a read call, about 1 us).
        """
        if self._compression_of(path) is not None:  # a file of ours, never cut: sliced
            buffer = self._buffer(path)
            check_whole(buffer, dataset=self.dataset, shard=path)
            return lambda starts, ends: [buffer[a:b] for a, b in zip(starts, ends, strict=True)]
        # the file object itself, not its number: another thread may evict it from the LRU
        # meanwhile, and the number, closed, would be reused by the next shard opened
        handle = self._files.get_or_load(path, partial(Descriptor, path))
        if path in self._identities:  # a local shard (set as its index loaded)
            self._check_identity(path, identity(os.fstat(handle.fileno())))
        return lambda starts, ends: read_spans(handle.fileno(), starts, ends)

    def _compression_of(self, path: str) -> Compression | None:
        if path in self._compression:
            return self._compression[path]
        try:
            compression = self._compression[path] = compression_of(path)
        except ForeignError as error:
            raise DataError(str(error), dataset=self.dataset, shard=path) from None
        return compression

    def _buffer(self, path: str) -> mmap.mmap | bytes:
        """The whole shard: a plain one mapped (for the scan that indexes it), a compressed one
        decompressed (and kept, as its lines are sliced from it)."""
        compression = self._compression_of(path)
        if compression is None:
            return map_file(path)
        return self._decompressed.get_or_load(path, partial(self._decompress, path, compression))

    def _decompress(self, path: str, compression: Compression) -> mmap.mmap | bytes:
        """The shard decompressed in the shard cache, mapped (see the module's docstring); in
        memory, with a warning, where the cache folder cannot take it (not writable, full)."""
        folder = self.cache.directory
        source = os.path.abspath(path)
        download = self._download(path)
        held = 0  # a download stays pinned in the cache while it is decompressed: room for both
        if download is not None:
            key = f"decompressed\0{download}"
            held = os.path.getsize(path)
        else:
            stat = os.stat(path)
            self._check_identity(path, identity(stat))  # not a later version than the index
            version = f"{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\0{stat.st_ctime_ns}"
            key = f"decompressed\0{source}\0{version}"  # a copy with `cp -p` is another
        room = self.cache.max_bytes - held
        make = partial(decompress_to, path, compression, limit=room)
        try:
            try:
                with self._cache().open_made(key, f"{source} (decompressed)", make) as local:
                    return map_file(local)  # stays valid once unpinned, even if evicted
            except TooLargeError:
                beside = f" minus its {held}-byte compressed download" if held else ""
                raise ConfigError(
                    f"{path!r} decompresses to more than the shard cache's `max_bytes` "
                    f"({self.cache.max_bytes}){beside}: raise it (io_options={{'cache': "
                    "{'max_bytes': ...}})"
                ) from None
            except (ImportError, StorageError, CorruptError):
                raise
            except (OSError, CacheFolderError) as error:  # the folder cannot take it
                _log.warning(
                    "cannot decompress %r into the shard cache %r (%s): holding it in memory",
                    path,
                    folder,
                    error,
                )
                return decompress_bytes(path, compression)
        except CorruptError as error:
            raise DataError(
                f"cannot decompress this {compression} file: {error}",
                dataset=self.dataset,
                shard=path,
            ) from error

    def _cache(self) -> ShardCache:
        """This process's handle on the shard cache (a forked child opens its own)."""
        held = self._shard_cache
        if held is None or held[0] != os.getpid():
            held = (os.getpid(), ShardCache(self.cache.directory, self.cache.max_bytes))
            self._shard_cache = held
        return held[1]


_CUT_NOTE = (
    "; it is the shard's last line and no newline ends it: was the file cut short (a copy or "
    "a write that stopped midway)?"
)


def _newlines_before(path: str, end: int) -> int | None:
    """The newlines among the first ``end`` bytes of the file at ``path``; None where it has
    fewer bytes (cut short since it was indexed)."""
    count = 0
    with open(path, "rb") as file:
        while end > 0:
            piece = file.read(min(end, _COUNT_PIECE))
            if not piece:
                return None
            count += piece.count(b"\n")
            end -= len(piece)
    return count
