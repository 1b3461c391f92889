"""Random access to MosaicML MDS datasets (`index.json` plus `.mds` shards), read natively.

Opening reads `index.json` only: the shard list, each shard's sample count and column layout
(plus one stat per shard). A shard is `[uint32 n][uint32 offsets[n + 1]][json config][samples]`;
a plain shard is memory-mapped, so a row is one slice and a decode of the requested columns
only. A compressed shard (`.mds.zstd`, `.gz`, `.bz2`, `.br`, `.snappy`) cannot be sliced in
place: it is decompressed whole, once, into a small LRU (4 shards by default), which suits
pointer streams that visit a bounded window of shards (2 cores, windows of 64 rows in random
order, 100 words and 500 ids a row: about 220 k rows/s, plain or zstd once inflated). Remote
index and shards come through a `locate` hook, into the shard cache. Streaming is not imported.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from struct import error as StructError
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError
from zephon_torch.io._cache import LruCache
from zephon_torch.io._compression import TooLargeError, inflate
from zephon_torch.io._hashes import HashMismatch, ShardHashes
from zephon_torch.io._index import load_index
from zephon_torch.io._locate import Locate, local_file
from zephon_torch.io._mapped import check_whole, map_file
from zephon_torch.io._mds_bulk import BULK_ROWS, ShardArrays, one_array
from zephon_torch.io._mds_columns import SUPPORTED, Decoder, array_config, decoder
from zephon_torch.io._mds_index import shard_entries
from zephon_torch.io._mds_samples import SampleLayout, columns_disagree, decode_sample
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import Projection
from zephon_torch.io._rows import (
    CUT_NOTE,
    Rows,
    TokenIds,
    as_row_array,
    check_in_range,
    machine_fault,
)
from zephon_torch.io._views import TokenSpans, TypedViews


@dataclass(frozen=True)
class _ShardInfo:
    samples: int
    raw_bytes: int
    codec: str | None  # "zstd", "gz", ...; None for a plain shard
    layout: SampleLayout
    stored_bytes: int | None = None  # a compressed shard's file size, as index.json records it
    hashes: dict[str, str] = field(default_factory=dict, compare=False)  # of the stored file


@dataclass(frozen=True)
class _Shard:
    """A shard's bytes (a memory map or decompressed bytes) and its sample offsets; its one
    array column, read in bulk, where the rows keep only that (`one_array`)."""

    data: memoryview
    offsets: npt.NDArray[np.int64]
    layout: SampleLayout
    views: TypedViews = field(init=False, compare=False)
    arrays: ShardArrays | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        views = TypedViews(self.data)
        object.__setattr__(self, "views", views)
        spec, layout = self.layout.one_array, self.layout
        arrays = (
            None
            if spec is None
            else ShardArrays(views, self.offsets, spec, layout.variable, layout.fixed)
        )
        object.__setattr__(self, "arrays", arrays)


class MdsReader(PickledAsSettings):
    """Reads the shards of one MDS dataset; thread-safe, and picklable without its caches.

    Args:
        dataset: the dataset name, used in error messages.
        index_path: the dataset's `index.json`; a URL with a remote `locate` (shard paths
            are then URLs next to it, and the caller checks that they exist).
        projection: the columns to read (None reads all) and the token columns, which must be
            `ndarray` columns of one dimension.
        max_open: how many plain shards to keep memory-mapped.
        max_decompressed: how many decompressed shards to keep in memory.
        locate: turns the index's and the shards' paths into local files; the default reads
            local paths as they are.
        verify_hashes: check each shard file against a hash `index.json` records for it, the
            first time this process opens it (see `MdsOptions`).

    Raises:
        DataError: for an unreadable index, a shard it names outside its folder or lists
            twice, a local shard file it lists that is missing, a shard it records as empty
            whose own header holds samples (read at open), a column with an encoding not
            read, a projection naming a missing column, or (with `verify_hashes`) a shard with
            no hash recorded that this machine can compute.
    """

    SETTINGS = (
        "dataset",
        "index_path",
        "projection",
        "max_open",
        "max_decompressed",
        "locate",
        "verify_hashes",
    )  # what it pickles as

    def __init__(
        self,
        *,
        dataset: str,
        index_path: str,
        projection: Projection | None = None,
        max_open: int = 32,
        max_decompressed: int = 4,
        locate: Locate = local_file,
        verify_hashes: bool = False,
    ) -> None:
        self.dataset = dataset
        self.index_path = index_path
        self.projection = projection or Projection()
        self.max_open = max_open
        self.max_decompressed = max_decompressed
        self.locate = locate
        self.verify_hashes = verify_hashes
        self._open_caches()

    def _open_caches(self) -> None:
        self._hashes = ShardHashes(self.dataset) if self.verify_hashes else None
        self._infos = self._read_index()
        self._shards: LruCache[_Shard] = LruCache(self.max_open)
        self._inflated: LruCache[_Shard] = LruCache(self.max_decompressed)

    def verifying(self, verify_hashes: bool) -> MdsReader:
        """A reader of the same dataset, with `verify_hashes` set and its caches empty."""
        return MdsReader(**{**self.__getstate__(), "verify_hashes": verify_hashes})

    @property
    def shard_paths(self) -> list[str]:
        """The shard files, in `index.json` order."""
        return list(self._infos)

    def num_rows(self, path: str) -> int:
        """Returns the shard's sample count from `index.json`; reads no shard."""
        return self._infos[path].samples

    def maps_token_ids(self) -> bool:
        """Whether no shard is compressed (each is then mapped, see `_read`)."""
        return all(info.codec is None for info in self._infos.values())

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the given samples of the shard as dicts, in the order asked.

        Args:
            path: the shard.
            rows: sample numbers within the shard, any order, repeats allowed.

        Returns:
            One new dict per requested row; arrays are read-only views of the shard.

        Raises:
            DataError: for a truncated or corrupt shard, naming it, or a sample that does not
                decode, naming it too.
        """
        info, positions, shard = self._open_rows(path, rows)
        arrays = self._arrays(positions, shard)
        if arrays is not None:
            name = info.layout.one_array.name  # type: ignore[union-attr]
            return [{name: array} for array in arrays]
        return self._decoded(path, info, positions, shard)

    def _decoded(
        self, path: str, info: _ShardInfo, positions: npt.NDArray[np.int64], shard: _Shard
    ) -> list[dict[str, Any]]:
        """The rows decoded sample by sample, naming one that does not decode."""
        layout = info.layout
        starts = shard.offsets[positions].tolist()
        ends = shard.offsets[positions + 1].tolist()
        result = []
        for row, start, end in zip(positions.tolist(), starts, ends, strict=True):
            try:
                result.append(decode_sample(shard.data[start:end], layout))
            # ArithmeticError: a str_decimal that is no number; RecursionError: deep json
            except (
                ValueError,
                KeyError,
                IndexError,
                StructError,
                ArithmeticError,
                RecursionError,
            ) as error:
                raise DataError(
                    f"sample does not decode: {error!r}", dataset=self.dataset, shard=path, row=row
                ) from None
        for name in self.projection.token_columns:
            for row, values in zip(positions.tolist(), result, strict=True):
                array = values[name]
                if array.ndim != 1 or array.dtype.kind not in "iu":  # `ndarray`: any dtype
                    raise DataError(
                        f"token column {name!r} holds an array of shape {array.shape} and dtype "
                        f"{array.dtype}, not a 1-D array of integer token ids",
                        dataset=self.dataset,
                        shard=path,
                        row=row,
                    )
        return result

    def read_tokens(self, path: str, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """The rows' arrays where rows keep one 1-D integer array column, `field`; else None.

        Read in bulk (see `ShardArrays`), else sample by sample (a short request, or a sample
        the bulk read does not take: the per-sample decoder names one that does not decode).
        """
        one = self._infos[path].layout.one_array
        if one is None or one.name != field or one.dtype.kind not in "iu":
            return None
        info, positions, shard = self._open_rows(path, rows)
        spans = self._arrays(positions, shard)
        if spans is not None:
            return spans
        arrays = [row[field] for row in self._decoded(path, info, positions, shard)]
        if any(array.ndim != 1 for array in arrays):
            return None  # rows then say which sample is not a 1-D array
        return arrays

    def _open_rows(self, path: str, rows: Rows) -> tuple[_ShardInfo, npt.NDArray[np.int64], _Shard]:
        info = self._infos[path]
        positions = as_row_array(rows)
        check_in_range(positions, info.samples, dataset=self.dataset, shard=path)
        cache = self._shards if info.codec is None else self._inflated
        shard = cache.get_or_load(path, partial(self._load, path, info))
        check_whole(shard.data, dataset=self.dataset, shard=path)
        return info, positions, shard

    def _arrays(self, positions: npt.NDArray[np.int64], shard: _Shard) -> TokenSpans | None:
        """The rows' one array each, read in bulk; None when the layout has no single array
        column, the request is short (until the shard's places are found), or a sample needs
        the per-sample decoder (which names it)."""
        arrays = shard.arrays
        if arrays is None or (len(positions) < BULK_ROWS and not arrays.found):
            return None
        return arrays.read(positions)

    def _read_index(self) -> dict[str, _ShardInfo]:
        index = load_index(self.index_path, dataset=self.dataset, locate=self.locate)
        infos: dict[str, _ShardInfo] = {}
        layouts: dict[tuple[Any, ...], SampleLayout] = {}
        try:
            for entry in shard_entries(index, index_path=self.index_path, dataset=self.dataset):
                key = (entry.names, entry.encodings, entry.sizes)
                if key not in layouts:  # checked once, naming its first shard
                    layouts[key] = self._layout(*key, shard=entry.path)
                info = _ShardInfo(
                    samples=entry.samples,
                    raw_bytes=entry.raw_bytes,
                    codec=entry.codec,
                    layout=layouts[key],
                    stored_bytes=entry.stored_bytes,
                    hashes=entry.hashes,
                )
                if self._hashes is not None:  # refused at open when none is usable
                    self._hashes.pick(entry.path, entry.hashes)
                if entry.samples == 0:
                    # MDSWriter writes an empty shard when its first sample exceeds the size
                    # limit: not an error in the dataset, but a count damaged to 0 would drop
                    # a whole shard silently, so its header must say 0 too (a tiny read)
                    self._load(entry.path, info)
                    continue
                infos[entry.path] = info
        except DataError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(
                f"cannot read this MDS index: {error!r}",
                dataset=self.dataset,
                shard=self.index_path,
            ) from None
        if not infos:
            raise DataError(
                "the index lists no shards: the dataset is empty",
                dataset=self.dataset,
                shard=self.index_path,
            )
        return infos

    def _layout(
        self,
        names: tuple[str, ...],
        encodings: tuple[str, ...],
        sizes: tuple[int | None, ...],
        *,
        shard: str,
    ) -> SampleLayout:
        """The layout of the shards of these columns; errors name ``shard``, its first."""
        self.projection.check_available(names, dataset=self.dataset, shard=shard)
        wanted = self.projection.columns or names
        decoders: list[Decoder | None] = []
        for name, encoding in zip(names, encodings, strict=True):
            found = decoder(encoding) if name in wanted else None
            if name in wanted and found is None:
                raise DataError(
                    f"column {name!r} has encoding {encoding!r}, which is not read (read: "
                    f"{', '.join(SUPPORTED)}); leave it out with `columns=`",
                    dataset=self.dataset,
                    shard=shard,
                )
            if name in self.projection.token_columns:
                kind, _, config = encoding.partition(":")
                dtype = array_config(config)[0] if kind == "ndarray" else None
                if kind != "ndarray" or (dtype is not None and dtype.kind not in "iu"):
                    raise DataError(
                        f"token column {name!r} has encoding {encoding!r}, not an ndarray "
                        "of integer ids",
                        dataset=self.dataset,
                        shard=shard,
                    )
            decoders.append(found)
        kept = tuple(names.index(name) for name in wanted)
        return SampleLayout(
            names=names,
            encodings=encodings,
            sizes=sizes,
            decoders=tuple(decoders),
            kept=kept,
            one_array=one_array(names, encodings, sizes, kept),
        )

    def _load(self, path: str, info: _ShardInfo) -> _Shard:
        try:
            return self._load_once(path, info)
        except HashMismatch:  # a remote shard's cached copy is dropped by then: once more
            return self._load_once(path, info)

    def _load_once(self, path: str, info: _ShardInfo) -> _Shard:
        # Outside the try: a failed download is a StorageError, not bad data.
        with self.locate(path) as local:
            try:
                check = (
                    None if self._hashes is None else self._hashes.check(path, local, info.hashes)
                )
                data = _read(local, info, check)
            except (ImportError, DataError):
                raise
            except TooLargeError:
                raise DataError(
                    f"the shard decompresses to more than the {info.raw_bytes} bytes "
                    f"index.json records: the shard is corrupt{CUT_NOTE}",
                    dataset=self.dataset,
                    shard=path,
                ) from None
            except Exception as error:
                if machine_fault(error):
                    raise
                raise DataError(
                    f"cannot read the shard: {error}", dataset=self.dataset, shard=path
                ) from error
        if len(data) != info.raw_bytes:
            raise DataError(
                f"the shard is truncated or corrupt: {len(data)} bytes where index.json "
                f"records {info.raw_bytes}{CUT_NOTE}",
                dataset=self.dataset,
                shard=path,
            )
        count = int(np.frombuffer(data, "<u4", count=1)[0]) if len(data) >= 4 else -1
        header = 4 * (count + 2)
        if count != info.samples or len(data) < header:
            raise DataError(
                f"the shard header says {count} samples where index.json records "
                f"{info.samples}: the shard is corrupt{CUT_NOTE}",
                dataset=self.dataset,
                shard=path,
            )
        offsets = np.frombuffer(data, "<u4", count=count + 1, offset=4).astype(np.int64)
        if offsets[0] < header or offsets[-1] != len(data) or np.any(np.diff(offsets) < 0):
            raise DataError(
                "the shard's sample offsets are corrupt", dataset=self.dataset, shard=path
            )
        disagreement = columns_disagree(memoryview(data)[header : offsets[0]], info.layout)
        if disagreement is not None:
            raise DataError(
                f"index.json records {disagreement}: the index or the shard is corrupt{CUT_NOTE}",
                dataset=self.dataset,
                shard=path,
            )
        return _Shard(data=memoryview(data), offsets=offsets, layout=info.layout)


def _read(path: str, info: _ShardInfo, check: Callable[[Any], None] | None) -> mmap.mmap | bytes:
    """The shard's bytes, decompressed; `check` is given the file's bytes as stored. A
    compressed one's size is checked: zstd reads the first frame, and would skip the rest."""
    if info.codec is None:
        mapped = map_file(path)
        if check is not None:
            check(mapped)
        return mapped
    with open(path, "rb") as handle:
        packed = handle.read()
    if check is not None:
        check(packed)
    if info.stored_bytes is not None and len(packed) != info.stored_bytes:
        raise ValueError(
            f"truncated or corrupt: {len(packed)} bytes where index.json records "
            f"{info.stored_bytes} (zip_data){CUT_NOTE}"
        )
    return inflate(packed, info.codec, info.raw_bytes)
