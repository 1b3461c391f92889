"""Random access to LitData datasets (`index.json` plus chunk files), read natively.

Opening reads `index.json` only: chunks, their item counts, the item tree and leaf formats.
One chunk is one shard. Plain chunks are memory-mapped; whole-file zstd chunks are inflated
once into a small LRU; framed-zstd chunks inflate one frame (256 items) at a time; rows stored
in a chunk's Arrow footer are decoded one record batch (256 rows) at a time, only the projected
columns. A row is the item as written: a dict item is the row, any other item is
`{"item": value}`, and a `TokensLoader` item (one 1-D token array as written, recovered from
the chunk's item offsets, not LitData's fixed-size blocks) is `{"input_ids": tokens}`.
Measured on 2 cores, windows of 64 rows in random order, rows of 100-word text and 500 token
ids: about 270 k rows/s. A remote dataset's index and chunks are reached through a `locate`
hook that downloads them into the shard cache (see `_locate`). litdata is not imported.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from zephon_torch.errors import DataError
from zephon_torch.io import _litdata_format as fmt
from zephon_torch.io._arrow import BadTokenRow, TokenColumn, column_bytes, row_columns
from zephon_torch.io._cache import LruCache
from zephon_torch.io._index import (
    MAX_ITEMS,
    check_listed_once,
    load_index,
    recorded_count,
    shard_path,
)
from zephon_torch.io._litdata_damage import (
    CORRUPT,
    Footer,
    SharedDamage,
    batch_of,
    inflated,
    open_footer,
    unzstd,
)
from zephon_torch.io._locate import Locate, local_file
from zephon_torch.io._mapped import check_whole, map_file
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import TOKENS_FIELD, Projection, token_array
from zephon_torch.io._rows import (
    CUT_NOTE,
    Rows,
    TokenIds,
    as_row_array,
    check_in_range,
    machine_fault,
)
from zephon_torch.io._views import TokenSpans, TypedViews

_ITEM_FIELD = "item"


@dataclass(frozen=True)
class Chunk:
    data: memoryview
    layout: fmt.Layout
    footer: Footer | None
    # the footer's rows up to the end of each record batch, read as far as rows are asked for
    batch_ends: list[int]
    lock: threading.Lock
    views: TypedViews = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", TypedViews(self.data))


@dataclass(frozen=True)
class _Batch:
    names: tuple[str, ...]
    columns: tuple[list[Any] | TokenColumn, ...]
    nbytes: int


class LitDataReader(PickledAsSettings):
    """Reads the chunks of one LitData dataset; thread-safe, and picklable without caches.

    Args:
        dataset: the dataset name, used in error messages.
        index_path: the dataset's `index.json`; a URL with a remote `locate` (chunk paths
            are then URLs next to it, and the caller checks that they exist).
        projection: the columns to read (top-level keys of dict items; None reads all) and
            the token columns.
        max_open: how many chunks to keep mapped or inflated, and how many frames or record
            batches to keep decoded.
        locate: turns the index's and the chunks' paths into local files; the default reads
            local paths as they are.

    Raises:
        DataError: for an unreadable index, a chunk it names outside its folder or lists
            twice, a missing local chunk file, an encrypted dataset, an item loader other than
            PyTreeLoader or TokensLoader, or a leaf format not read.
    """

    SETTINGS = ("dataset", "index_path", "projection", "max_open", "locate")  # what it pickles as

    def __init__(
        self,
        *,
        dataset: str,
        index_path: str,
        projection: Projection | None = None,
        max_open: int = 8,
        locate: Locate = local_file,
    ) -> None:
        self.dataset = dataset
        self.index_path = index_path
        self.projection = projection or Projection()
        self.max_open = max_open
        self.locate = locate
        self._open_caches()

    def _open_caches(self) -> None:
        index = load_index(self.index_path, dataset=self.dataset, locate=self.locate)
        self._copies: dict[str, str] = {}  # a chunk's listed path -> the file read in its place
        try:
            self._configure(index["config"])
            if not index["chunks"]:
                raise ValueError("it lists no chunks")
            compression = index["config"].get("compression")
            paths = [self._chunk_path(chunk["filename"], compression) for chunk in index["chunks"]]
            check_listed_once(paths, dataset=self.dataset)
            count = partial(recorded_count, dataset=self.dataset)
            self._rows = {
                path: (
                    count(chunk["chunk_size"], "items", shard=path, most=MAX_ITEMS),
                    count(chunk["chunk_bytes"], "bytes", shard=path),
                )
                for path, chunk in zip(paths, index["chunks"], strict=True)
            }
        except DataError:
            raise
        except (*CORRUPT, TypeError) as error:
            if machine_fault(error):
                raise
            raise self._error(f"cannot read this LitData index: {error}", self.index_path) from None
        self._chunks: LruCache[Chunk] = LruCache(self.max_open)
        self._frames: LruCache[memoryview] = LruCache(self.max_open * 4)
        self._batches: LruCache[_Batch] = LruCache(self.max_open * 4)

    def _configure(self, config: dict[str, Any]) -> None:
        if config.get("encryption"):
            raise ValueError("encrypted chunks are not read")
        self._loader = config.get("item_loader") or "PyTreeLoader"
        if self._loader not in ("PyTreeLoader", "TokensLoader"):
            raise ValueError(f"item_loader {self._loader} is not read")
        self._per_item_zstd = config.get("compression_level") == "sample"
        self._compressed = config.get("compression") is not None
        formats = config["data_format"]
        # a damaged entry is no format name: the leaf decoders parse each one as a str
        if not isinstance(formats, list) or not all(isinstance(name, str) for name in formats):
            raise ValueError(f"data_format is {formats!r}, not a list of format names")
        if self._loader == "TokensLoader":
            self._tree = fmt.Node(kind=None, keys=(), children=(), leaves=1)
            names: tuple[str, ...] = (TOKENS_FIELD,)
            spans = {TOKENS_FIELD: (0, 1)}
        else:
            self._tree = fmt.parse_tree(config["data_spec"])
            names = self._tree.keys if self._tree.kind == "dict" else (_ITEM_FIELD,)
            spans = {_ITEM_FIELD: (0, self._tree.leaves)}
            if self._tree.kind == "dict":
                ends = np.cumsum([child.leaves for child in self._tree.children]).tolist()
                spans = dict(zip(names, zip([0, *ends[:-1]], ends), strict=True))
                # fields the first item lacks are in `types` and the Arrow footers only
                late = tuple(key for key in config.get("types") or {} if key not in spans)
                names += late
                spans.update(dict.fromkeys(late, (0, 0)))
        self.projection.check_available(names, dataset=self.dataset, shard=self.index_path)
        self._names = self.projection.columns or names
        self._decoders: list[fmt.Decoder | None] = [None] * len(formats)
        # TokensLoader items are bare arrays of this type (sliced from the chunk, see read)
        self._token_dtype = fmt.leaf_dtype(formats[0]) if self._loader == "TokensLoader" else None
        for name in self._names:
            for leaf in range(*spans[name]):
                decoder = fmt.leaf_decoder(formats[leaf])
                if decoder is None:
                    raise self._error(fmt.not_read(name, formats[leaf]), self.index_path)
                self._decoders[leaf] = decoder
            first, end = spans[name]
            kind = formats[first].partition(":")[0] if end > first else "json"
            if name in self.projection.token_columns and kind not in (*fmt.ARRAY_LEAVES, "json"):
                raise ValueError(f"token column {name!r} has leaf format {kind!r}")
            dtype = fmt.leaf_dtype(formats[first]) if end > first else None
            if (
                name in self.projection.token_columns
                and dtype is not None
                and dtype.kind not in "iu"
            ):
                raise ValueError(f"token column {name!r} holds arrays of {dtype}, not integer ids")

    def _chunk_path(self, name: str, compression: object) -> str:
        """The path of a chunk the index lists. litdata's own reader of a local dataset
        replaces each compressed chunk it reads with its decompressed copy (and removes the
        compressed file): where the listed file is gone, that copy is read in its place, and
        the chunk keeps its listed name (so a state's fingerprint still matches)."""
        copy = fmt.decompressed_name(name, compression)
        if copy is not None and "://" not in self.index_path:
            listed = shard_path(self.index_path, name, dataset=self.dataset, must_exist=False)
            copy_path = shard_path(self.index_path, copy, dataset=self.dataset, must_exist=False)
            if not os.path.isfile(listed) and os.path.isfile(copy_path):
                self._copies[listed] = copy_path
                return listed
        return shard_path(self.index_path, name, dataset=self.dataset)

    @property
    def shard_paths(self) -> list[str]:
        """The chunk files, in `index.json` order."""
        return list(self._rows)

    def num_rows(self, path: str) -> int:
        """Returns the chunk's item count from `index.json`; reads no chunk."""
        return self._rows[path][0]

    def maps_token_ids(self) -> bool:
        """Whether the chunks are not compressed (each is then mapped, see `_read`)."""
        return not self._compressed

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the given items of the chunk as row dicts, in the order asked.

        Raises:
            DataError: for a truncated or corrupt chunk, naming it, or an item that does not
                decode, naming it too.
        """
        positions, chunk = self._open_rows(path, rows)
        arrays = self._token_items(chunk, positions)
        if arrays is not None:
            return [{TOKENS_FIELD: array} for array in arrays]
        result = []
        for row in positions.tolist():
            try:
                if chunk.footer is not None:
                    result.append(self._footer_row(path, chunk, row))
                else:
                    result.append(self._body_row(path, chunk, row))
            except BadTokenRow as error:  # the item's own fault, named as such
                raise self._error(f"{error} {row}", path, row) from None
            except SharedDamage as error:
                raise self._error(
                    f"cannot read the part of the chunk this item lies in: {error}",
                    path,
                    row,
                    shard_wide=True,
                ) from None
            except CORRUPT as error:
                raise self._error(f"item does not decode: {error!r}", path, row) from None
        return result

    def read_tokens(self, path: str, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """The items' token ids (views of the chunk) for `TokensLoader` chunks of integer ids
        stored whole, and the field "input_ids"; else None."""
        if field != TOKENS_FIELD or self._loader != "TokensLoader":
            return None
        positions, chunk = self._open_rows(path, rows)
        return self._token_items(chunk, positions)

    def _open_rows(self, path: str, rows: Rows) -> tuple[npt.NDArray[np.int64], Chunk]:
        positions = as_row_array(rows)
        check_in_range(positions, self._rows[path][0], dataset=self.dataset, shard=path)
        chunk = self._chunks.get_or_load(path, partial(self._load, path))
        check_whole(chunk.data, dataset=self.dataset, shard=path)
        return positions, chunk

    def _token_items(self, chunk: Chunk, positions: npt.NDArray[np.int64]) -> TokenSpans | None:
        """The items as slices of the chunk where they are `TokensLoader` integer arrays
        lying whole in its body; None otherwise, or when an item's size is not a whole number
        of ids (then `read` decodes item by item, naming the one that does not decode)."""
        dtype = self._token_dtype
        if not self._whole_token_items(chunk) or dtype is None or dtype.kind not in "iu":
            return None
        offsets = chunk.layout.offsets
        starts, ends = offsets[positions], offsets[positions + 1]
        if ((ends - starts) % dtype.itemsize).any():
            return None
        return chunk.views.slices(dtype, starts, (ends - starts) // dtype.itemsize)

    def _whole_token_items(self, chunk: Chunk) -> bool:
        """Whether the chunk's items are `TokensLoader` arrays lying whole in its body (no
        footer, no compressed frames or items): then a row is a slice, read without a call."""
        return (
            self._loader == "TokensLoader"
            and chunk.footer is None
            and not chunk.layout.frames
            and not self._per_item_zstd
        )

    def _footer_row(self, path: str, chunk: Chunk, row: int) -> dict[str, Any]:
        number, within = batch_of(chunk, row)
        batch = self._batches.get_or_load((path, number), partial(self._batch, chunk, number))
        return dict(zip(batch.names, [column[within] for column in batch.columns], strict=True))

    def _batch(self, chunk: Chunk, number: int) -> _Batch:
        assert chunk.footer is not None
        # any failure is the whole batch's (a row's own, a null id, shows as the row is read)
        try:
            with chunk.lock:
                batch = chunk.footer.get_batch(number)
            # read without checks: damaged offsets would crash the process (SystemError,
            # SIGSEGV)
            batch.validate(full=True)
            # an optional field that no item of the chunk has is not in its footer: null there
            stored, rows = batch.schema.names, len(batch)
            arrays = [
                batch.column(name) if name in stored else pa.nulls(rows) for name in self._names
            ]
            batch = pa.RecordBatch.from_arrays(arrays, names=list(self._names))
            names, columns = row_columns(batch, self.projection.token_columns)
        except CORRUPT as error:
            raise SharedDamage(f"record batch {number} of its Arrow footer: {error!r}") from None
        return _Batch(names, columns, column_bytes(columns, batch.nbytes))

    def _body_row(self, path: str, chunk: Chunk, row: int) -> dict[str, Any]:
        item = self._item(path, chunk, row)
        if self._loader == "TokensLoader":
            decode = self._decoders[0]
            assert decode is not None
            return {TOKENS_FIELD: decode(item)}
        count = len(self._decoders)
        sizes = struct.unpack_from(f"<{count}I", item)
        leaves: list[Any] = []
        position = 4 * count
        for size, decode in zip(sizes, self._decoders, strict=True):
            if position + size > len(item):
                raise ValueError("a leaf runs past the end of the item")
            leaves.append(decode(item[position : position + size]) if decode else None)
            position += size
        value = self._tree.build(iter(leaves))
        if self._tree.kind != "dict":
            value = {_ITEM_FIELD: value}
        row_value = {name: value.get(name) for name in self._names}
        for name in self.projection.token_columns:
            if not isinstance(row_value[name], np.ndarray):  # a "json" leaf: a list of ids
                row_value[name] = token_array(row_value[name])
            if row_value[name].ndim != 1:
                raise ValueError(f"token column {name!r} holds shape {row_value[name].shape}")
        return row_value

    def _item(self, path: str, chunk: Chunk, row: int) -> memoryview:
        offsets = chunk.layout.offsets
        if not chunk.layout.frames:
            item = chunk.data[offsets[row] : offsets[row + 1]]
            if self._per_item_zstd:
                return unzstd(item)
            return item
        frames = chunk.layout.frames
        frame = next((f for f in frames if f.first <= row < f.first + f.count), None)
        if frame is None:
            raise SharedDamage(f"no compressed frame holds item {row}")
        body = self._frames.get_or_load((path, frame.first), partial(self._inflate, chunk, frame))
        base = offsets[frame.first]
        return body[offsets[row] - base : offsets[row + 1] - base]

    def _inflate(self, chunk: Chunk, frame: fmt.Frame) -> memoryview:
        packed = chunk.data[frame.start : frame.start + frame.length]
        what = f"the compressed frame of items {frame.first}..{frame.first + frame.count - 1}"
        try:
            data = inflated(packed, frame.inflated)
        except ValueError as error:
            raise SharedDamage(f"{what}: {error}") from None
        if len(data) != frame.inflated:
            raise SharedDamage(f"{what} inflates to {len(data)} bytes, not {frame.inflated}")
        return data

    def _load(self, path: str) -> Chunk:
        items, size = self._rows[path]
        # Outside the try: a failed download is a StorageError, not bad data.
        with self.locate(self._copies.get(path, path)) as local:
            return self._parse(path, local, items, size)

    def _parse(self, path: str, local: str, items: int, size: int) -> Chunk:
        try:
            data = _read(local)
            if bytes(data[:4]) == fmt.ZSTD_MAGIC:
                data = inflated(data, size)
            if len(data) != size:
                raise ValueError(f"{len(data)} bytes where index.json records {size}")
            layout = fmt.parse_layout(data, items)
            footer, batch_ends = None, []
            if layout.footer is not None:
                start, length = layout.footer
                footer = open_footer(data[start : start + length])
                if footer.num_record_batches == 0:
                    raise ValueError("the Arrow footer holds no rows")
                batch_ends.append(footer.get_batch(0).num_rows)
        except ImportError:
            raise
        except CORRUPT as error:
            if machine_fault(error):
                raise
            raise self._error(
                f"the chunk is truncated or corrupt: {error}{CUT_NOTE}", path
            ) from None
        return Chunk(data, layout, footer, batch_ends, threading.Lock())

    def _error(
        self, message: str, shard: str, row: int | None = None, *, shard_wide: bool = False
    ) -> DataError:
        return DataError(message, dataset=self.dataset, shard=shard, row=row, shard_wide=shard_wide)


def _read(path: str) -> memoryview:
    return memoryview(map_file(path))
