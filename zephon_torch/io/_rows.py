"""Row-number arguments: whatever the caller passes becomes one int64 array, checked once."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError

if TYPE_CHECKING:
    from zephon_torch.io.dataset import Dataset

Rows: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]
"""Row numbers within a shard: a sequence of ints or an integer numpy array."""

TokenIds: TypeAlias = npt.NDArray[np.integer[Any]]
"""A row's stored token ids: a 1-D integer array (a view of the stored ids where it can be)."""

CHANGED_NOTE = " (did the file change after the dataset was opened?)"
"""Appended by readers whose own row count disagrees with the one the dataset recorded."""

CUT_NOTE = " (written or copied wrongly, or changed after the dataset was opened)"
"""Appended where a shard's bytes disagree with its index.json: so since it was written, or
since the open."""


# errors of the machine, not of a file's bytes: out of descriptors or memory, a failing disk,
# a file the process may not read
_MACHINE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.ENOSPC, errno.EAGAIN}
    | {errno.EACCES, errno.EPERM, errno.EINTR}
)


def machine_fault(error: BaseException) -> bool:
    """Whether a reader's `error` is the machine's, not the shard's: a `MemoryError`, or an
    `OSError` whose errno says so (too many open files, no memory, an I/O error, permission).
    Readers raise those as they are: a `DataError` saying a healthy shard is unreadable or
    corrupt would send the user to rebuild good data. A format library's own `OSError` for bad
    bytes carries no such errno, and is the data's."""
    return isinstance(error, MemoryError) or (
        isinstance(error, OSError) and error.errno in _MACHINE_ERRNOS
    )


def rust_machine_fault(error: BaseException) -> OSError | None:
    """The machine's fault that a Rust library (vortex-data) reports only in its message, as
    "... (os error 24)", as an `OSError` of that errno to raise as it is; else None."""
    found = re.search(r"\(os error (\d+)\)", str(error))
    if found is None or int(found.group(1)) not in _MACHINE_ERRNOS:
        return None
    number = int(found.group(1))
    return OSError(number, f"{os.strerror(number)} ({str(error).strip().splitlines()[0]})")


def utf8_name(path: str, *, dataset: str, library: str) -> str:
    """``path`` as the text a ``library`` that opens files only by UTF-8 names (pyarrow,
    vortex-data) opens it by: the text of its bytes read as UTF-8. That is ``path`` itself
    where Python decodes file names as UTF-8; under another file-system encoding (ASCII under
    a C locale without UTF-8 mode) Python's text of a UTF-8 name holds surrogates, which the
    library cannot open. A name that is not UTF-8 (its bytes come as surrogates from
    `os.listdir`) is refused before the library fails on it with a message that blames the
    file's contents.

    Raises:
        DataError: naming the shard, saying to rename it.
    """
    try:
        return os.fsencode(path).decode("utf-8")
    except UnicodeError:
        raise DataError(
            f"the file's name is not valid UTF-8, and {library} opens files only by UTF-8 "
            "names: rename the file (its contents were not read)",
            dataset=dataset,
            shard=path,
        ) from None


def as_row_array(rows: Rows) -> npt.NDArray[np.int64]:
    """Returns `rows` as a one-dimensional int64 array.

    Args:
        rows: row numbers.

    Returns:
        The row numbers, not yet checked against any shard size.

    Raises:
        TypeError: when `rows` holds anything but integers.
    """
    if isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1:
        return cast("npt.NDArray[np.int64]", rows)
    if not len(rows):
        return np.empty(0, dtype=np.int64)
    array = np.asarray(rows)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"`rows` must be a flat sequence of ints, got {_describe(rows)}")
    return array.astype(np.int64, copy=False)


def _describe(rows: Rows) -> str:
    shown = list(rows[:3]) if not isinstance(rows, np.ndarray) else rows[:3].tolist()
    return f"{type(rows).__name__} starting {shown!r}"


def check_in_range(
    positions: npt.NDArray[np.int64], count: int, *, dataset: str, shard: str, note: str = ""
) -> None:
    """Raises DataError naming the first row outside `[0, count)`, if any.

    Args:
        positions: row numbers, from `as_row_array`.
        count: the shard's row count.
        dataset: the dataset name, for the message.
        shard: the shard path, for the message.
        note: appended to the message, for example a likely cause.

    Raises:
        DataError: naming the dataset, the shard, the row and `count`.
    """
    if not positions.size or (int(positions.min()) >= 0 and int(positions.max()) < count):
        return
    bad = int(positions[(positions < 0) | (positions >= count)][0])
    raise DataError(
        f"row {bad} is out of range: the shard has {count} rows{note}",
        dataset=dataset,
        shard=shard,
        row=bad,
        shard_wide=True,
    )


def where_in_file(reader: Any, path: str, row: int) -> str | None:
    """Where row `row` of shard `path` lies in its file, as `reader` tells it for an error to
    name ("line 37 of the file": JSONL, whose rows skip blank lines); None for readers whose
    row numbers are all an error needs."""
    line_of = getattr(reader, "line_of", None)
    return None if line_of is None else line_of(path, row)


def name_line(error: DataError, datasets: Iterable[Dataset]) -> None:
    """Add to ``error``, where it names a row of a JSONL shard of one of ``datasets``, the
    row's line in the file (see `Dataset.line_of`): a user who opens the file at "row 30"
    would read the wrong line where blank lines come before it. Never raises."""
    if error.row is None or error.shard is None:
        return
    for dataset in datasets:
        if dataset.name == error.dataset:
            place = dataset.line_of(error.shard, error.row)
            if place is not None:
                error.add_place(place)
            return
