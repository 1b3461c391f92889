"""``zephon-torch inspect PATH --validate``: read every row of a dataset before a job does.

A job stops at its first bad row (or, under ``bad_rows="skip"``, counts it): hours in, on a row
that one pass over the data would have shown. This pass reads every row of every shard as a
pipeline's reading does, and, given the field the job takes (``--text-field`` for ``tokenize``,
``--token-field`` for ``pretokenized``), checks it as the pipeline will. It reports each bad row
and each unreadable shard by dataset, shard, row (and a JSONL row's line), and goes on: the rows
around a bad one are read as a pipeline under ``bad_rows="skip"`` reads them. Storage errors
past the retries still end it (exit code 2, as any error of the command).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.io.dataset import name_line
from zephon_torch.ops.document import skipping_bad
from zephon_torch.ops.pretokenized import field_error, token_ids

CHUNK_ROWS = 4096  # rows read at once: a bad row costs its chunk a few more reads
VALIDATION_FAILED_EXIT = 1  # bad rows or shards found (2: the command itself failed)


@dataclass
class Findings:
    """What one pass found: counts, the first errors in full, and the ids seen."""

    rows: int = 0
    bad_rows: int = 0
    bad_shards: int = 0
    empty: int = 0  # rows whose text or ids are empty: they give no tokens
    errors: list[str] = field(default_factory=list)  # the first `shown`, in reading order
    smallest: int | None = None  # of the token ids, over the rows read
    largest: int | None = None

    def add_error(self, error: DataError, shown: int) -> None:
        if len(self.errors) < shown:
            self.errors.append(" ".join(str(error).split()))

    def add_ids(self, ids: np.ndarray[Any, Any]) -> None:
        if not ids.size:
            self.empty += 1
            return
        low, high = int(ids.min()), int(ids.max())
        self.smallest = low if self.smallest is None else min(self.smallest, low)
        self.largest = high if self.largest is None else max(self.largest, high)


def validate(
    dataset: Dataset,
    *,
    text_field: str | None = None,
    token_field: str | None = None,
    shown: int = 10,
    out: TextIO,
) -> int:
    """Read every row of ``dataset`` and check ``text_field`` (a string, or UTF-8 bytes) or
    ``token_field`` (a 1-D list of integer ids) in each; print what was found. Returns 0 where
    every row read and checked, else ``VALIDATION_FAILED_EXIT``."""
    found = Findings()
    started = time.perf_counter()
    for shard in range(len(dataset.shards)):
        _validate_shard(dataset, shard, text_field, token_field, found, shown)
    seconds = time.perf_counter() - started
    _report(dataset, found, text_field or token_field, seconds, shown, out)
    return VALIDATION_FAILED_EXIT if found.bad_rows or found.bad_shards else 0


def _validate_shard(
    dataset: Dataset,
    shard: int,
    text_field: str | None,
    token_field: str | None,
    found: Findings,
    shown: int,
) -> None:
    size = dataset.shards[shard].num_rows
    check = _checker(dataset, shard, text_field, token_field, found)
    for start in range(0, size, CHUNK_ROWS):
        rows = list(range(start, min(start + CHUNK_ROWS, size)))
        try:
            results = skipping_bad(check, rows, _bad, _named)
        except DataError as error:  # no row's: the shard is damaged from here on
            name_line(error, [dataset])
            found.bad_shards += 1
            found.add_error(error, shown)
            return
        for result in results:
            if isinstance(result, DataError):
                name_line(result, [dataset])
                found.bad_rows += 1
                found.add_error(result, shown)
        found.rows += len(rows)


def _checker(
    dataset: Dataset,
    shard: int,
    text_field: str | None,
    token_field: str | None,
    found: Findings,
) -> Callable[[list[int]], list[DataError | None]]:
    """The step for ``skipping_bad``: read ``rows`` of ``shard`` and check the field; a row's
    fault raises a ``DataError`` naming it. Counts (ids, empty rows) are taken only once a
    whole list passed, so a list retried around a bad row counts each row once."""
    path = dataset.shards[shard].path

    def check(rows: list[int]) -> list[DataError | None]:
        if token_field is not None:
            stored = dataset.read_tokens(shard, rows, token_field)
            if stored is not None:  # kept as 1-D integer arrays: nothing to check but ids
                for ids in stored:
                    found.add_ids(np.asarray(ids))
                return [None] * len(rows)
        data = dataset.read_rows(shard, rows)
        taken: list[Any] = []
        for row, values in zip(rows, data, strict=True):
            try:
                if token_field is not None:
                    taken.append(token_ids(values.get(token_field)))
                elif text_field is not None:
                    taken.append(_text(values, text_field))
            except (TypeError, ValueError) as error:
                message = (
                    str(error) if token_field is None else field_error(token_field, values, error)
                )
                raise DataError(message, dataset=dataset.name, shard=path, row=row) from None
        for value in taken:
            if isinstance(value, str):
                found.empty += not value
            else:
                found.add_ids(value)
        return [None] * len(rows)

    return check


def _text(values: dict[str, Any], name: str) -> str:
    """``values[name]`` as the text ``tokenize`` takes, a string or bytes of UTF-8; else a
    ValueError saying what it is (the words of ``tokenize``'s own error)."""
    value = values.get(name)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"field {name!r} holds bytes that are not UTF-8 text: {error}"
            ) from None
    if name not in values:
        raise ValueError(f"field {name!r} is missing; the row has fields {sorted(values)}")
    raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")


def _bad(row: int, error: DataError) -> DataError:
    return error


def _named(rows: list[int], error: DataError) -> int | None:
    """Where among ``rows`` (of one shard) the row ``error`` names is."""
    row = error.row
    if row is None or not rows or not rows[0] <= row <= rows[-1]:
        return None
    return row - rows[0]


def _report(
    dataset: Dataset,
    found: Findings,
    checked: str | None,
    seconds: float,
    shown: int,
    out: TextIO,
) -> None:
    shards = len(dataset.shards)
    read = f"{found.rows:,} rows of {shards:,} shard{'' if shards == 1 else 's'} in {seconds:.2f} s"
    field_words = f"; field {checked!r} checked in each" if checked else ""
    problems = []
    if found.bad_rows:
        problems.append(f"{found.bad_rows:,} bad row{'' if found.bad_rows == 1 else 's'}")
    if found.bad_shards:
        count = found.bad_shards
        problems.append(f"{count:,} shard{'' if count == 1 else 's'} unreadable past an error")
    verdict = ", ".join(problems) if problems else "no bad row"
    print(f"validate: {verdict}: read {read}{field_words}", file=out)
    if found.empty:
        are = "row is" if found.empty == 1 else "rows are"
        print(f"  {found.empty:,} {are} empty (they give no tokens)", file=out)
    if found.smallest is not None:
        print(
            f"  token ids from {found.smallest:,} to {found.largest:,} (a run refuses ids "
            "outside [0, vocab_size) of its tokenizer or model)",
            file=out,
        )
    for error in found.errors:
        print(f"  {error}", file=out)
    more = found.bad_rows + found.bad_shards - len(found.errors)
    if more > 0:
        print(f"  ... and {more:,} more (--show-errors sets how many are printed)", file=out)
