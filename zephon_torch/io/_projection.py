"""Column projection and token columns, shared by every reader.

A projection names the columns a dataset's rows keep (None keeps all) and the token columns:
columns of token ids that come back as one 1-D numpy integer array per row instead of a list of
Python ints, so a pre-tokenized corpus reaches the packer without a Python int per token.
Readers that can skip unread columns on disk (Parquet, Vortex, MDS, LitData) take the
projection themselves; any other reader is wrapped in `ProjectedReader`, which drops the other
keys after decoding.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io._rows import Rows, where_in_file

TOKENS_FIELD = "input_ids"
"""The field that holds the token ids of formats whose rows have no names (LitData
`TokensLoader` chunks, `.npy` token files)."""


class ColumnMismatch(DataError):
    """A shard lacks a column its projection reads, or a token column of it holds no lists of
    integers: the shard's fault, at its open, where its whole rows would each be at fault (see
    `io._narrowing`)."""


@dataclass(frozen=True)
class Projection:
    """Which columns rows keep and which of them hold token ids.

    Args:
        columns: the columns to keep, in this order; None keeps every column.
        token_columns: columns whose values are returned as 1-D numpy integer arrays.
    """

    columns: tuple[str, ...] | None = None
    token_columns: tuple[str, ...] = ()

    @classmethod
    def of(cls, columns: Sequence[str] | None, token_columns: Sequence[str] | None) -> Projection:
        """Checks and builds a projection from `from_path` arguments.

        Raises:
            ConfigError: for a str instead of a list, an empty or repeated name, or a token
                column that `columns` leaves out.
        """
        kept = None if columns is None else _names("columns", columns)
        if kept is not None and not kept:
            raise ConfigError("`columns` must name at least one column, or be None for all")
        tokens = () if token_columns is None else _names("token_columns", token_columns)
        if kept is not None:
            missing = [name for name in tokens if name not in kept]
            if missing:
                raise ConfigError(
                    f"`token_columns` must be among `columns` {list(kept)}, got {missing}"
                )
        return cls(columns=kept, token_columns=tokens)

    def keeps(self, name: str) -> bool:
        """Whether rows keep the column `name`."""
        return self.columns is None or name in self.columns

    def check_available(self, available: Sequence[str], *, dataset: str, shard: str) -> None:
        """Raises `ColumnMismatch` when a shard lacks a requested column.

        Args:
            available: the shard's columns.
            dataset: the dataset name, for the message.
            shard: the shard path (or index file), for the message.
        """
        wanted = (self.columns or ()) + self.token_columns
        missing = sorted({name for name in wanted if name not in available})
        if missing:
            raise ColumnMismatch(
                f"has no column {', '.join(map(repr, missing))}; its columns are {list(available)}",
                dataset=dataset,
                shard=shard,
            )


def token_array(value: Any) -> npt.NDArray[np.integer[Any]]:
    """Returns `value` (a list of ints or an integer array) as a 1-D integer numpy array.

    Raises:
        ValueError: when `value` is not a flat sequence of integers.
    """
    if isinstance(value, np.ndarray):
        array = value
    else:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list of token ids, got {type(value).__name__}")
        # int64, or uint64 where an id needs it (kept: cast, 2**64 - 1 would read as -1)
        array = np.asarray(value) if value else np.empty(0, dtype=np.int64)
        if array.dtype.kind in "fO":
            array = wide_ids(value, array)
        if array.dtype.kind in "iu":
            check_no_bool(value)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(f"expected a flat list of integer token ids, got {_describe(array)}")
    return array


def wide_ids(ids: list[Any] | tuple[Any, ...], array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``ids`` as uint64 where numpy read them as floats or objects (``array``) only because
    some lie past int64 (``[3, 2**64 - 1]``), so that the id check names the id as written;
    ValueError naming an id that no 64-bit type holds with the others; ``array`` for anything
    else (not all integers)."""
    integral = (
        isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in ids
    )
    if not ids or not all(integral):
        return array
    values = [int(v) for v in ids]
    if min(values) >= 0 and max(values) < 1 << 64:
        return np.array(values, dtype=np.uint64)
    bad = next(v for v in values if not 0 <= v < 1 << 63)  # a negative one, or one past 64 bits
    raise ValueError(f"its id {bad} is no token id: ids must lie in [0, 2**31)")


def check_no_bool(ids: list[Any] | tuple[Any, ...]) -> None:
    """ValueError naming the first boolean among ``ids``, which numpy reads as integers: a JSON
    ``[5, true, 7]`` would pass as the ids ``[5, 1, 7]``."""
    kinds = set(map(type, ids))
    if bool in kinds or np.bool_ in kinds:
        at = next(i for i, v in enumerate(ids) if isinstance(v, (bool, np.bool_)))
        raise ValueError(f"item {at} is the boolean {ids[at]}, not an id")


def _describe(array: npt.NDArray[Any]) -> str:
    return f"an array of dtype {array.dtype} and shape {array.shape}"


def _names(argument: str, names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str) or not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"`{argument}` must be a list of non-empty column names, got {names!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"`{argument}` must not repeat a column, got {list(names)}")
    return tuple(names)


class ProjectedReader:
    """Applies a projection to the rows of a reader that cannot project itself (JSONL).

    A requested column missing from a row raises DataError naming the row; a token column
    whose value is not a flat list of integers does too.

    Args:
        reader: the wrapped reader (any `ShardReader`).
        projection: the columns to keep and the token columns.
        dataset: the dataset name, used in error messages.
    """

    def __init__(self, reader: Any, *, projection: Projection, dataset: str) -> None:
        self.reader = reader
        self.projection = projection
        self.dataset = dataset

    def num_rows(self, path: str) -> int:
        """Returns the wrapped reader's row count."""
        return int(self.reader.num_rows(path))

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns the wrapped reader's rows with only the projected columns.

        Raises:
            DataError: for a row without a requested column or a malformed token column.
        """
        decoded: list[dict[str, Any]] = self.reader.read(path, rows)
        columns, tokens = self.projection.columns, self.projection.token_columns
        if columns is None and not tokens:
            return decoded
        numbers = np.asarray(rows).tolist()
        result = []
        for row, number in zip(decoded, numbers, strict=True):
            try:
                kept = dict(row) if columns is None else {name: row[name] for name in columns}
                for name in tokens:
                    kept[name] = token_array(row[name])
            except KeyError as error:
                raise DataError(
                    f"has no field {error.args[0]!r}; its fields are {sorted(row)}",
                    dataset=self.dataset,
                    shard=path,
                    row=number,
                ) from None
            except ValueError as error:
                raise DataError(
                    f"token column {name!r}: {error}", dataset=self.dataset, shard=path, row=number
                ) from None
            result.append(kept)
        return result

    def line_of(self, path: str, row: int) -> str | None:
        """The wrapped reader's place of the row in its file (see `_rows.where_in_file`)."""
        return where_in_file(self.reader, path, row)


def token_ids(value: Any) -> npt.NDArray[np.integer[Any]]:
    """``value`` as a 1-D integer array (itself when it is one).

    Raises:
        TypeError: for anything else, saying what it was.
        ValueError: for a list holding a boolean (numpy would read it as 0 or 1).
    """
    if type(value) is np.ndarray and value.ndim == 1 and value.dtype.kind in "iu":
        return value
    tokens = np.asarray(value)
    if tokens.dtype.kind in "fO" and isinstance(value, (list, tuple)):
        tokens = wide_ids(value, tokens)
    if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
        if isinstance(value, (list, tuple)) and None in value:  # a null id (Parquet, JSON)
            raise TypeError(f"its id at position {value.index(None)} is null (None)")
        shape, dtype = tokens.shape, tokens.dtype
        raise TypeError(f"got {type(value).__name__} of shape {shape} and dtype {dtype}")
    if isinstance(value, (list, tuple)):
        check_no_bool(value)
    return tokens if tokens.size else tokens.astype(np.int32)


def missing_field(field: str, data: dict[str, Any]) -> str:
    """That ``field`` is missing from the row ``data``, with the row's fields, and the one
    whose name is closest where one is close (a misspelt field is missing from every row)."""
    fields = sorted(map(str, data))
    close = difflib.get_close_matches(field, fields, n=1, cutoff=0.6)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"field {field!r} is missing; the row has fields {fields}{guess}"


def field_error(field: str, data: dict[str, Any], error: Exception) -> str:
    """What is wrong with ``data[field]`` as token ids."""
    if field not in data:
        return missing_field(field, data)
    return f"field {field!r} must hold a 1-D list of integer token ids: {error}"


def text_of(data: dict[str, Any], field: str) -> str:
    """``data[field]`` as the text ``tokenize`` takes: a string, or bytes of UTF-8 (a Parquet
    ``binary`` column of text, as Spark may write it). Raises ValueError saying what it is
    instead."""
    value = data.get(field)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"field {field!r} holds bytes that are not UTF-8 text: {error}"
            ) from None
    if field not in data:
        raise ValueError(missing_field(field, data))
    raise ValueError(f"field {field!r} must be a string, got {type(value).__name__}")


def id_limit(vocab_size: int | None) -> tuple[int, str]:
    """The first id a run refuses (``vocab_size``, else ``2**31``: ids must fit int32), and
    how an error names it."""
    if vocab_size is None:
        return 1 << 31, "2**31"
    return vocab_size, f"{vocab_size} (vocab_size)"
