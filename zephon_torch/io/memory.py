"""In-memory shards for tests, examples and small tables built in Python.

The rows live in the reader, so they travel with a pickled `Dataset` to worker processes; keep
such datasets small (the whole table is copied into every worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon_torch.errors import ConfigError
from zephon_torch.io._rows import Rows, as_row_array, check_in_range


class MemoryReader:
    """Reads rows held in memory, one list of row dicts per shard path.

    Args:
        dataset: the dataset name, used in error messages.
        shards: rows by shard path (`memory://<dataset>/<i>`).
    """

    def __init__(self, *, dataset: str, shards: Mapping[str, list[dict[str, Any]]]) -> None:
        self.dataset = dataset
        self._shards = dict(shards)

    def num_rows(self, path: str) -> int:
        """Returns the number of rows of the shard."""
        return len(self._shards[path])

    def read(self, path: str, rows: Rows) -> list[dict[str, Any]]:
        """Returns shallow copies of the given rows of the shard, in the order asked.

        Args:
            path: the shard.
            rows: row numbers within the shard, any order, repeats allowed.

        Returns:
            One new dict per requested row; its values are shared with the dataset.

        Raises:
            DataError: for a row past the end of the shard.
        """
        table = self._shards[path]
        positions = as_row_array(rows)
        check_in_range(positions, len(table), dataset=self.dataset, shard=path)
        return [dict(table[row]) for row in positions.tolist()]


def rows_of(
    data: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Turns a table given by columns or by rows into a new list of row dicts.

    Args:
        data: columns (a mapping of equally long sequences or arrays) or rows (a sequence of
            mappings).

    Returns:
        The rows, each a new dict.

    Raises:
        ConfigError: when columns differ in length, a row is not a mapping, or `data` is
            neither form.
    """
    if isinstance(data, Mapping):
        return _rows_from_columns(data)
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise ConfigError(
            "`data` must be a mapping of columns or a sequence of row mappings, "
            f"got {type(data).__name__}"
        )
    rows: list[dict[str, Any]] = []
    for number, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise ConfigError(
                f"`data` rows must be mappings, got {type(row).__name__} at row {number}"
            )
        rows.append(dict(row))
    return rows


def _rows_from_columns(columns: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    values: dict[str, list[Any]] = {}
    for name, column in columns.items():
        if isinstance(column, (str, bytes)) or not hasattr(column, "__len__"):
            raise ConfigError(
                f"`data` column {name!r} must be a sequence or array, got {type(column).__name__}"
            )
        # numpy and pyarrow columns give Python scalars through tolist/to_pylist.
        if hasattr(column, "tolist"):
            values[name] = list(column.tolist())
        elif hasattr(column, "to_pylist"):
            values[name] = list(column.to_pylist())
        else:
            values[name] = list(column)
    lengths = {name: len(column) for name, column in values.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r}: {length}" for name, length in lengths.items())
        raise ConfigError(f"`data` columns must all have the same length, got {listed}")
    names = list(values)
    return [dict(zip(names, row, strict=True)) for row in zip(*values.values(), strict=True)]
