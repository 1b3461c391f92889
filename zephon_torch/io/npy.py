"""Pre-tokenized `.npy` files: one shard per file, one document of token ids per row.

Two layouts, both memory-mapped, so a row is a read-only view and opening reads headers only:

- a 2-D integer array `[rows, tokens]`: row i is `array[i]` (fixed-length documents, such as
  sequences already cut to the context length);
- a 1-D integer array of all tokens plus a sibling `<stem>.offsets.npy`, a 1-D integer array of
  `rows + 1` increasing boundaries from 0 to the token count: row i is
  `tokens[offsets[i]:offsets[i + 1]]` (variable-length documents; the offsets file is not a
  shard of its own).

Rows are `{"input_ids": array}` in the stored integer dtype. A remote file and its offsets
are reached through a `locate` hook that downloads them into the shard cache (see `_locate`);
`_mapped.read_header` lets the remote reader count rows from a few header bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError
from zephon_torch.io._cache import LruCache
from zephon_torch.io._locate import Locate, local_file
from zephon_torch.io._mapped import check_whole, map_array
from zephon_torch.io._pickled import PickledAsSettings
from zephon_torch.io._projection import TOKENS_FIELD, Projection
from zephon_torch.io._rows import (
    CHANGED_NOTE,
    Rows,
    TokenIds,
    as_row_array,
    check_in_range,
    machine_fault,
)
from zephon_torch.io._views import TokenSpans

OFFSETS_SUFFIX = ".offsets.npy"


def offsets_path(path: str) -> str:
    """The offsets file that goes with a 1-D token file."""
    return path[: -len(".npy")] + OFFSETS_SUFFIX


def unused_offsets(path: str, shape: tuple[int, ...], *, dataset: str) -> DataError:
    """The error for a 2-D token file that has an offsets file beside it, which its rows of
    fixed length would leave unused: the documents those offsets mark would be lost."""
    return DataError(
        f"holds a 2-D array of shape {shape} (rows of fixed length), but "
        f"{os.path.basename(offsets_path(path))!r} beside it marks documents of their own "
        "lengths, which would be left unused: store the tokens 1-D, remove the offsets "
        "file, or name the token files alone (a path or glob that leaves the offsets out)",
        dataset=dataset,
        shard=path,
    )


def check_row_length(path: str, shape: tuple[int, ...], *, dataset: str) -> None:
    """Refuses a 2-D token file of rows of no token: its header alone (128 bytes, no data)
    can claim any number of them, each read and skipped as an empty document, so that a
    claim of 10**18 rows read for ever (about 160,000 rows a second).

    Raises:
        DataError: naming the file and its shape.
    """
    if len(shape) == 2 and shape[0] > 0 and shape[1] == 0:
        raise DataError(
            f"holds a 2-D array of shape {shape}: {shape[0]} documents of no token, which "
            "would each be read and skipped as empty; write the documents' tokens, or "
            "remove the file",
            dataset=dataset,
            shard=path,
        )


def token_files(files: Sequence[str]) -> list[str]:
    """Drops the offsets files that go with a token file in `files`; they are not shards."""
    listed = set(files)
    return [
        file
        for file in files
        if not (file.endswith(OFFSETS_SUFFIX) and file[: -len(OFFSETS_SUFFIX)] + ".npy" in listed)
    ]


def unlisted_offsets(files: Sequence[str]) -> list[str]:
    """The offsets files of the token files in `files` that `files` leave out, in order: a
    listing of what a URL named, to be read beside them as a local reader finds them."""
    listed = set(files)
    wanted = (offsets_path(f) for f in files if not f.endswith(OFFSETS_SUFFIX))
    return [partner for partner in wanted if partner not in listed]


@dataclass(frozen=True)
class _TokenFile:
    tokens: npt.NDArray[np.integer[Any]]
    offsets: npt.NDArray[np.int64] | None  # None for a 2-D file

    @property
    def num_rows(self) -> int:
        return len(self.tokens) if self.offsets is None else len(self.offsets) - 1


class NpyReader(PickledAsSettings):
    """Reads the `.npy` token shards of one dataset; thread-safe, picklable without its maps.

    Args:
        dataset: the dataset name, used in error messages.
        projection: columns; only "input_ids" exists.
        max_open: how many files to keep memory-mapped.
        locate: turns a token file's and an offsets file's path into a local file; the
            default reads local paths as they are.
    """

    SETTINGS = (
        "dataset",
        "projection",
        "max_open",
        "locate",
        "offsets_files",
    )  # what it pickles as

    def __init__(
        self,
        *,
        dataset: str,
        projection: Projection | None = None,
        max_open: int = 64,
        locate: Locate = local_file,
    ) -> None:
        self.dataset = dataset
        self.projection = projection or Projection()
        self.max_open = max_open
        self.locate = locate
        self.offsets_files: frozenset[str] = frozenset()  # those the path named (`token_files`)
        self._open_caches()

    def _open_caches(self) -> None:
        self._files: LruCache[_TokenFile] = LruCache(self.max_open)

    def num_rows(self, path: str) -> int:
        """Returns the row count from the `.npy` headers."""
        return self._file(path).num_rows

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns `{"input_ids": tokens}` for each requested row, in the order asked.

        Raises:
            DataError: for a row past the end of the file.
        """
        return [{TOKENS_FIELD: ids} for ids in self._ids(path, rows)]

    def read_tokens(self, path: str, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        """The rows' token ids (views of the map), for the field "input_ids"; else None."""
        return self._ids(path, rows) if field == TOKENS_FIELD else None

    def maps_token_ids(self) -> bool:
        """Always: the token files are mapped (`map_array`)."""
        return True

    def _ids(self, path: str, rows: Rows) -> TokenSpans:
        file = self._file(path)
        positions = as_row_array(rows)
        check_in_range(positions, file.num_rows, dataset=self.dataset, shard=path)
        tokens = file.tokens
        check_whole(tokens, dataset=self.dataset, shard=path)
        if file.offsets is None:
            return TokenSpans.of([tokens[row] for row in positions.tolist()])
        check_whole(file.offsets, dataset=self.dataset, shard=offsets_path(path))
        starts, ends = file.offsets[positions], file.offsets[positions + 1]
        return TokenSpans.repeated(tokens, starts, ends)

    def _file(self, path: str) -> _TokenFile:
        return self._files.get_or_load(path, partial(self._open, path))

    def _open(self, path: str) -> _TokenFile:
        self.projection.check_available([TOKENS_FIELD], dataset=self.dataset, shard=path)
        try:
            tokens = self._load(path)
        except FileNotFoundError:
            raise DataError(
                f"the token file is missing{CHANGED_NOTE}", dataset=self.dataset, shard=path
            ) from None
        partner = offsets_path(path)
        if tokens.ndim == 2:
            check_row_length(path, tokens.shape, dataset=self.dataset)
            # among the files the path named (a remote one's listing: `npy_rows`)
            if partner in self.offsets_files:
                raise unused_offsets(path, tokens.shape, dataset=self.dataset)
            return _TokenFile(tokens=tokens, offsets=None)
        try:
            stored = self._load(partner, "offsets") if tokens.ndim == 1 else None
        except FileNotFoundError:
            stored = None
        if stored is None and path.endswith(OFFSETS_SUFFIX):  # listed as a shard, without
            token_file = os.path.basename(path[: -len(OFFSETS_SUFFIX)] + ".npy")  # its tokens
            raise DataError(
                f"an offsets file without its token file {token_file!r} (lost, or never written?)",
                dataset=self.dataset,
                shard=path,
            )
        if stored is None:
            raise DataError(
                f"holds an array of shape {tokens.shape}: a token file is 2-D [rows, tokens], "
                f"or 1-D with its document boundaries in {os.path.basename(partner)!r}",
                dataset=self.dataset,
                shard=path,
            )
        offsets = stored.astype(np.int64)
        if (
            offsets.ndim != 1
            or len(offsets) < 1  # [0] with no token: a file of no rows, refused as such
            or offsets[0] != 0
            or offsets[-1] != len(tokens)
            or np.any(np.diff(offsets) < 0)
        ):
            raise DataError(
                f"the offsets in {os.path.basename(partner)!r} must rise from 0 to the "
                f"token count {len(tokens)} (a damaged offsets file, or one written for other "
                "tokens)",
                dataset=self.dataset,
                shard=path,
            )
        return _TokenFile(tokens=tokens, offsets=offsets)

    def _load(self, path: str, what: str = "token ids") -> npt.NDArray[np.integer[Any]]:
        """Maps an integer `.npy` file (of `what`, for errors); FileNotFoundError when there is
        none.

        The locate is outside the try: a failed download is a StorageError, not bad data.
        """
        with self.locate(path) as local:
            try:
                array: npt.NDArray[np.integer[Any]] = map_array(local)
            except FileNotFoundError:
                raise
            except (OSError, ValueError, EOFError) as error:  # EOFError: an empty file
                if machine_fault(error):
                    raise
                raise DataError(
                    f"not a readable .npy file: {error}", dataset=self.dataset, shard=path
                ) from None
        if array.dtype.kind not in "iu":
            raise DataError(
                f"holds {array.dtype} values, not integer {what}",
                dataset=self.dataset,
                shard=path,
            )
        return array
